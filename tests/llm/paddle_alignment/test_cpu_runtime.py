"""llm/paddle_alignment/cpu_runtime.py: MKL's AVX2 path on AMD CPUs, MKL's threads and malloc's thresholds, set before paddle loads, never over the
user's own settings; and every entry point applies them before it imports paddle."""

import ast
import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

from paddle_alignment.cpu_runtime import (
    MARKER,
    configure_cpu_runtime,
    cpu_vendor_and_flags,
    read_cpuinfo,
    recommended_settings,
    usable_cpus,
)


AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 avx fma avx2 bmi2

processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu vme sse sse2 avx fma avx2 bmi2
"""
INTEL = AMD.replace("AuthenticAMD", "GenuineIntel").replace("AMD EPYC", "Intel(R) Xeon(R)")
OLD_AMD = AMD.replace(" avx2", "")


def printed_words(script, env=None):
    """The words a fresh Python running `script` (in the repository) printed; it must succeed."""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


ENTRY_POINTS = [
    "llm/alignment/ppo/run_ppo.py",
    "llm/alignment/rm/run_reward.py",
    "llm/run_finetune.py",
    "llm/predict/predictor.py",
    "benchmarks/bench_grpo.py",
    "benchmarks/bench_rollout.py",
    "benchmarks/bench_matmul.py",
    "tests/conftest.py",
    "tests/probes/grpo_first_step.py",
    "tests/probes/tp_rollout.py",
    "tests/probes/whiten_over_ranks.py",
    "llm/paddle_alignment/rollout/sampler.py",
]


def test_vendor_and_flags_from_cpuinfo_text():
    vendor, flags = cpu_vendor_and_flags(AMD)
    assert vendor == "AuthenticAMD" and {"avx2", "fma"} <= flags
    assert cpu_vendor_and_flags("") == ("", set())
    assert read_cpuinfo("/nonexistent/cpuinfo") == ""


@pytest.mark.parametrize("cpuinfo, expected", [(AMD, "5"), (INTEL, None), (OLD_AMD, None), ("", None)])
def test_avx2_path_only_on_amd_cpus_with_avx2(cpuinfo, expected):
    environ = {}
    configure_cpu_runtime(environ, cpuinfo=cpuinfo, cpus=2)
    assert environ.get("MKL_DEBUG_CPU_TYPE") == expected
    assert environ["MKL_NUM_THREADS"] == "2"


def test_user_settings_are_kept():
    environ = {"MKL_DEBUG_CPU_TYPE": "4", "MKL_NUM_THREADS": "3"}
    assert configure_cpu_runtime(environ, cpuinfo=AMD, cpus=2) == {}
    assert environ == {"MKL_DEBUG_CPU_TYPE": "4", "MKL_NUM_THREADS": "3"}
    # MKL follows OMP_NUM_THREADS when MKL_NUM_THREADS is unset: the user's OMP_NUM_THREADS decides.
    environ = {"OMP_NUM_THREADS": "1"}
    assert configure_cpu_runtime(environ, cpuinfo=AMD, cpus=2) == {"MKL_DEBUG_CPU_TYPE": "5"}
    assert "MKL_NUM_THREADS" not in environ and environ["OMP_NUM_THREADS"] == "1"


def test_switched_off():
    environ = {"PADDLE_ALIGNMENT_CPU_RUNTIME": "off"}
    assert configure_cpu_runtime(environ, cpuinfo=AMD, cpus=2) == {}
    assert environ == {"PADDLE_ALIGNMENT_CPU_RUNTIME": "off"}


def test_launched_processes_share_the_cores():
    parent = {}
    configure_cpu_runtime(parent, cpuinfo=AMD, cpus=2)
    assert parent["MKL_NUM_THREADS"] == "2" and MARKER in parent
    again = dict(parent)
    configure_cpu_runtime(again, cpuinfo=AMD, cpus=2)
    assert again == parent
    # A child of `paddle.distributed.launch --nproc_per_node 2` inherits the parent's values: they are not
    # the user's, so it takes its own share.
    child = dict(parent, PADDLE_LOCAL_SIZE="2")
    configure_cpu_runtime(child, cpuinfo=AMD, cpus=2)
    assert child["MKL_NUM_THREADS"] == "1" and child["MKL_DEBUG_CPU_TYPE"] == "5"
    # ... and a child started with the user's OMP_NUM_THREADS drops the parent's MKL_NUM_THREADS.
    child = dict(parent, OMP_NUM_THREADS="1")
    configure_cpu_runtime(child, cpuinfo=AMD, cpus=2)
    assert "MKL_NUM_THREADS" not in child
    # A user's value equal to nothing set here stays, even next to the marker.
    child = dict(parent, MKL_NUM_THREADS="7", PADDLE_LOCAL_SIZE="2")
    configure_cpu_runtime(child, cpuinfo=AMD, cpus=2)
    assert child["MKL_NUM_THREADS"] == "7"


def test_a_second_call_after_paddle_loaded_keeps_the_threads():
    """A script that configures, imports paddle (which sets OMP_NUM_THREADS=1), then imports an entry point
    (which configures again) keeps MKL's threads: paddle's value is not the user's."""
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_NUM_THREADS", "OMP_NUM_THREADS", MARKER)}
    code = (
        "import os\nfrom paddle_alignment.cpu_runtime import configure_cpu_runtime\nfirst = configure_cpu_runtime()\n"
        "import paddle\nassert os.environ['OMP_NUM_THREADS'] == '1'\nassert configure_cpu_runtime() == first\n"
        "print(os.environ.get('MKL_NUM_THREADS'))"
    )
    assert printed_words(code, env)[-1] == recommended_settings(read_cpuinfo(), usable_cpus())["MKL_NUM_THREADS"]


def test_threads_never_below_one():
    assert recommended_settings(INTEL, cpus=2, local_processes=8)["MKL_NUM_THREADS"] == "1"


def first_line(tree, predicate):
    lines = [node.lineno for node in ast.walk(tree) if predicate(node)]
    return min(lines) if lines else None


def imports_paddle(node):
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
        if node.module.startswith("llm") and node.module != "paddle_alignment.cpu_runtime":
            return True  # llm's modules import paddle
    else:
        return False
    return any(name.split(".")[0] in ("paddle", "paddlenlp", "helpers") for name in names)


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_entry_points_configure_before_paddle_loads(path):
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    configured = first_line(
        tree, lambda n: isinstance(n, ast.Call) and getattr(n.func, "id", None) == "configure_cpu_runtime"
    )
    assert configured is not None, f"{path} does not call configure_cpu_runtime()"
    assert configured < first_line(tree, imports_paddle), f"{path} imports paddle before configure_cpu_runtime()"


def test_a_fresh_process_gets_the_settings():
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_DEBUG_CPU_TYPE", "MKL_NUM_THREADS", "OMP_NUM_THREADS", MARKER)}
    env.pop("PADDLE_ALIGNMENT_CPU_RUNTIME", None)
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_matmul.py", "--seconds", "0.01"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = recommended_settings(read_cpuinfo(), usable_cpus())
    settings = result.stdout.splitlines()[0]
    assert f"MKL_DEBUG_CPU_TYPE={expected.get('MKL_DEBUG_CPU_TYPE', '(unset)')}" in settings
    assert f"MKL_NUM_THREADS={expected['MKL_NUM_THREADS']}" in settings
    assert result.stdout.strip().splitlines()[-1].startswith("gflops_geomean=")


def test_openmp_workers_sleep_at_once_and_a_process_can_run_at_idle_priority():
    script = (
        "import ctypes, glob, os, paddle\n"
        "from paddle_alignment.cpu_runtime import openmp_workers_sleep_when_idle, run_at_idle_priority\n"
        "iomp = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(paddle.__file__), 'libs', 'libiomp5*.so*'))[0])\n"
        "before = iomp.kmp_get_blocktime()\n"
        "assert openmp_workers_sleep_when_idle()\n"
        "run_at_idle_priority()\n"
        "print(before, iomp.kmp_get_blocktime(), os.sched_getscheduler(0) == os.SCHED_IDLE)\n"
    )
    assert printed_words(script)[-3:] == ["200", "0", "True"]  # Intel OpenMP's default 200 ms of spinning, then none


def test_mkl_runs_the_local_threads_inside_the_block_and_its_own_setting_after():
    script = (
        "import paddle\n"
        "from paddle_alignment.cpu_runtime import mkl_local_threads, mklml\n"
        "mkl = mklml()\n"
        "mkl.MKL_Set_Num_Threads_Local(2)\n"
        "with mkl_local_threads(1):\n"
        "    inside = mkl.MKL_Get_Max_Threads()\n"
        "print(inside, mkl.MKL_Get_Max_Threads())\n"
    )
    assert printed_words(script)[-2:] == ["1", "2"]


MALLOC_PROBE = """
import ctypes, os
from paddle_alignment.cpu_runtime import configure_cpu_runtime

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
configure_cpu_runtime()
block = libc.malloc(24 << 20)
ctypes.memset(block, 1, 24 << 20)
mapped = libc.mallinfo2().hblkhd
libc.free(block)
print(mapped >> 20, libc.mallinfo2().arena >> 20)
"""


@pytest.mark.parametrize("switch", ["on", "off"])
def test_freed_tensor_memory_stays_with_the_process(switch):
    # A 24 MiB block, a tensor's size: from the heap, and kept there once freed, so that the next step's
    # tensors do not fault their pages in again; glibc's defaults map it from the kernel and unmap it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PADDLE_ALIGNMENT_CPU_RUNTIME"] = switch
    mapped_mib, heap_mib = map(int, printed_words(MALLOC_PROBE, env))
    if switch == "on":
        assert mapped_mib == 0 and heap_mib >= 24
    else:
        assert mapped_mib == 24 and heap_mib < 24
