"""CPU math-library settings that must be in the environment before `paddle` is imported.

Paddle's CPU wheel multiplies matrices with MKL (libmklml_intel). On AMD CPUs MKL picks its generic
code path, several times slower than its AVX2 one (docs/performance.md); `MKL_DEBUG_CPU_TYPE=5` makes it
take the AVX2 path.
MKL reads the variable once, at its first call (measured: set after the first product it has no
effect), so it is set before `import paddle`.

Threads: `import paddle` sets OMP_NUM_THREADS=1 when it is unset, so MKL runs on one thread.
`MKL_NUM_THREADS` (which MKL prefers to OMP_NUM_THREADS, and which Paddle's own OpenMP loops ignore)
gives MKL the cores this process may use, shared among the processes `paddle.distributed.launch` starts
on this machine (PADDLE_LOCAL_SIZE). A user's OMP_NUM_THREADS is a thread choice too: it is kept, and
MKL follows it. Paddle's launcher has imported paddle, so its children inherit OMP_NUM_THREADS=1 and
run MKL on one thread unless MKL_NUM_THREADS is set for them.

Memory: Paddle's CPU tensors come from glibc's malloc, which gives an allocation above its mmap
threshold fresh pages from the kernel and returns them on free, and returns the freed top of its heap; the
next step's tensors then fault their pages in again. Measured on the tiny GRPO step (2 cores): 10-34
thousand page faults a second in a decoupled trainer, 3-15 thousand in a colocated one, and about 5 in
either with the thresholds below (see docs/decoupled_rollout.md). So the process's tensors up to 32 MiB
come from the heap, and up to 64 MiB of freed heap stay with the process (glibc's own upper values for
the thresholds it adapts). The user's MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is kept.

Entry points call `configure_cpu_runtime()` before they import paddle. A value the user set in the
environment is never changed. `PADDLE_ALIGNMENT_CPU_RUNTIME=off` turns all of it off.
"""

import contextlib
import ctypes
import functools
import glob
import os

# Records the values set here, so that a child process (which inherits them) can tell them apart from
# the user's own and recompute them for its own share of the cores.
MARKER = "PADDLE_ALIGNMENT_CPU_DEFAULTS"
SWITCH = "PADDLE_ALIGNMENT_CPU_RUNTIME"
# MKL's AVX2 code path, the one it takes on an Intel CPU with AVX2 and no AVX-512.
MKL_AVX2 = "5"
# glibc mallopt parameters and the values set (see the module's text), and the variables that set them.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES = 32 << 20, 64 << 20
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
# What configure_cpu_runtime() set for this process, once it ran (see there).
applied_here = None


def read_cpuinfo(path="/proc/cpuinfo"):
    """The text of /proc/cpuinfo, or "" where there is none (not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_vendor_and_flags(cpuinfo):
    """(vendor_id, set of flags) of the first processor listed in a /proc/cpuinfo text; ("", set())
    when the text does not say."""
    vendor, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
        if vendor and flags:
            break
    return vendor, flags


def usable_cpus():
    """Cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def recommended_settings(cpuinfo, cpus, local_processes=1):
    """The environment settings for this machine: MKL's AVX2 path on an AMD CPU with AVX2, and MKL's
    threads, the usable cores shared among the local processes."""
    settings = {}
    vendor, flags = cpu_vendor_and_flags(cpuinfo)
    if vendor == "AuthenticAMD" and "avx2" in flags:
        settings["MKL_DEBUG_CPU_TYPE"] = MKL_AVX2
    settings["MKL_NUM_THREADS"] = str(thread_share(cpus, local_processes))
    return settings


def thread_share(cpus, processes):
    """MKL threads of each of `processes` processes sharing `cpus` cores."""
    return max(1, cpus // max(1, processes))


def switched_off(environ):
    return environ.get(SWITCH, "").lower() in ("0", "off", "false", "no")


def user_set(environ, key):
    """Whether `key` is in `environ` with a value other than the one set here (recorded in MARKER)."""
    ours = dict(item.split("=", 1) for item in environ.get(MARKER, "").split(";") if "=" in item)
    return key in environ and ours.get(key) != environ[key]


def configure_cpu_runtime(environ=None, cpuinfo=None, cpus=None):
    """Put the recommended settings into `environ` (default os.environ) where the user has not set them;
    returns the ones set. For this process (no `environ` given), also keep freed memory for its tensors
    (keep_freed_memory). Call before `import paddle`. Thread settings are left alone when the user set any
    of OMP_NUM_THREADS / MKL_NUM_THREADS (MKL follows OMP_NUM_THREADS when MKL_NUM_THREADS is unset)."""
    global applied_here
    this_process = environ is None
    if this_process and applied_here is not None:
        # A second call (an entry point imported by a script that configured): since the first, `import
        # paddle` may have set OMP_NUM_THREADS=1, which must not pass for the user's and undo MKL's threads.
        return applied_here
    environ = os.environ if environ is None else environ
    if switched_off(environ):
        return {}
    if this_process and not any(key in environ for key in MALLOC_VARIABLES):
        keep_freed_memory()
    local = int(environ.get("PADDLE_LOCAL_SIZE") or 1)
    wanted = recommended_settings(read_cpuinfo() if cpuinfo is None else cpuinfo, cpus or usable_cpus(), local)
    if user_set(environ, "OMP_NUM_THREADS"):
        wanted.pop("MKL_NUM_THREADS")
        if "MKL_NUM_THREADS" in environ and not user_set(environ, "MKL_NUM_THREADS"):
            del environ["MKL_NUM_THREADS"]  # a parent's share of the cores, not the user's choice
    applied = {key: value for key, value in wanted.items() if not user_set(environ, key)}
    environ.update(applied)
    if applied:
        environ[MARKER] = ";".join(f"{key}={value}" for key, value in sorted(applied.items()))
    if this_process:
        applied_here = applied
    return applied


def keep_freed_memory():
    """glibc's malloc serves this process's allocations up to MMAP_THRESHOLD_BYTES from its heap and keeps
    up to TRIM_THRESHOLD_BYTES of freed heap (see the module's text); False where the C library is not
    glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def openmp_workers_sleep_when_idle():
    """Have this process's OpenMP workers (MKL's threads) sleep as soon as a parallel region ends instead of
    spinning (Intel OpenMP's KMP_BLOCKTIME), so that another process can use the cores they leave
    between matrix products. Paddle's CPU wheel ships Intel OpenMP as libs/libiomp5.so; returns False where
    this paddle has none (its OpenMP then keeps its own waiting policy)."""
    library = paddle_library("libiomp5*.so*")
    if library is None:
        return False
    ctypes.CDLL(library).kmp_set_blocktime(0)  # the library paddle loaded: same handle, same runtime
    return True


MKL_LIBRARY = "libmklml_intel.so"


def paddle_library(pattern):
    """The path of a library of Paddle's CPU wheel (its libs/ folder) matching `pattern`, or None."""
    import paddle

    found = glob.glob(os.path.join(os.path.dirname(paddle.__file__), "libs", pattern))
    return found[0] if found else None


@contextlib.contextmanager
def mkl_local_threads(count):
    """Run this thread's MKL products inside the block on `count` threads (MKL's thread-local setting; 1 for work
    too small to pay for waking MKL's other threads), the thread's own setting restored after. Does nothing
    where Paddle has no libmklml_intel."""
    mkl = mklml()
    if mkl is None:
        yield
        return
    previous = mkl.MKL_Set_Num_Threads_Local(count)
    try:
        yield
    finally:
        mkl.MKL_Set_Num_Threads_Local(previous)


@functools.lru_cache(maxsize=None)
def mklml():
    """Paddle's MKL (the instance its ops and the custom ops use: dlopen of a loaded library returns it), or None
    on a Paddle build without it (built with WITH_MKL=OFF, as for ARM CPUs)."""
    path = paddle_library(MKL_LIBRARY)
    return ctypes.CDLL(path) if path else None


def run_at_idle_priority():
    """Run this process only on CPU time that no other process wants (Linux SCHED_IDLE)."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def describe(environ=None):
    """One line naming the CPU settings in effect, for benchmark output."""
    environ = os.environ if environ is None else environ
    keys = ("MKL_DEBUG_CPU_TYPE", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
    return "cpu settings: " + ", ".join(f"{key}={environ.get(key, '(unset)')}" for key in keys)
