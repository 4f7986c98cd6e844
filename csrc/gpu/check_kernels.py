"""The CUDA rollout kernels checked without Paddle: rollout_kernels.cu compiled alone into a shared library,
each launcher run on random inputs against the NumPy references (csrc/rollout_reference.py: the semantics of
csrc/README.md and the same counter-based draws as the CPU ops).

    python csrc/gpu/check_kernels.py [--rows 16 256] [--vocab 151936] [--repeats 50]    # on a GPU
    python csrc/gpu/check_kernels.py --emulate [--sanitize thread|address] [--vocab N]   # on the CPU

On a GPU (nvcc, CuPy and a CUDA device: the lent GPU machine has them, and no Paddle) nvcc builds it, the
launchers run on CuPy arrays, and the sampling kernel is timed against the device's memory bandwidth. With
--emulate g++ builds the same file against emulation/cuda_runtime.h, which runs every CUDA thread of a block
as an OS thread, __syncthreads() as a barrier of them and a warp shuffle as an exchange between the warp's
threads, and the launchers run on NumPy arrays: the kernels' arithmetic, indexing and barriers as written,
without a GPU's timing, lockstep or floating-point library. --sanitize thread runs it under ThreadSanitizer,
which reports two threads of a block touching the same memory with no barrier between them; --sanitize
address under AddressSanitizer, which reports a read or write outside the arrays. Sampling is checked in
fixed settings and on --random-batches random batches. Prints one line per check and `kernels_checked=<n>`
last; runs every check and exits non-zero if any mismatched (66 at a sanitizer's report, which stops the
run). tests/csrc/test_rollout_ops.py runs it emulated everywhere, and on a GPU where there is one."""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

GPU_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(GPU_DIR))

from rollout_reference import (  # noqa: E402
    bookkeeping_batch, reference_keep_mask, reference_penalty, reference_sample, reference_save_step,
    reference_update_stop, uniform01,
)

P, I64, U64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
# The launchers of rollout_launchers.h and their argument types (pointers as void*).
LAUNCHERS = {
    "LaunchTokenPenalty": [P, P, P, P, P, P, P, P, P, I64, P, I64, I64, I64, I64, P],
    "LaunchSample": [P, P, P, P, P, P, P, U64, P, I64, I64, P],
    "LaunchSaveStep": [P, P, P, P, I64, I64, P],
    "LaunchUpdateStop": [P, P, P, P, I64, I64, I64, P, I64, P],
}


def build_library(folder, arch, sample_threads=None):
    """rollout_kernels.cu as a shared library for the GPU architecture `arch` (e.g. sm_90), by nvcc alone; the
    sampling kernel's blocks of `sample_threads` if given (the kernels' own number otherwise)."""
    library = os.path.join(folder, "librollout_kernels.so")
    command = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", f"-arch={arch}",
               *sample_threads_define(sample_threads), os.path.join(GPU_DIR, "rollout_kernels.cu"), "-o", library]
    subprocess.run(command, check=True)
    return library


# The sanitizers of --emulate --sanitize: the runtime g++ links, and its options (stop at the first report).
SANITIZERS = {"thread": ("libtsan.so", "TSAN_OPTIONS", "halt_on_error=1 exitcode=66"),
              "address": ("libasan.so", "ASAN_OPTIONS", "detect_leaks=0 halt_on_error=1 exitcode=66")}


def sample_threads_define(sample_threads):
    return [] if sample_threads is None else [f"-DROLLOUT_SAMPLE_THREADS={sample_threads}"]


# The sampling kernel's threads a block in the emulation: each is an OS thread, and every barrier of 1,024 of
# them costs milliseconds on two cores; 4 warps run the same code, its splits between warps included.
EMULATED_SAMPLE_THREADS = 128


def build_emulated_library(folder, sanitize=None, sample_threads=EMULATED_SAMPLE_THREADS):
    """rollout_kernels.cu as a shared library of the CPU, by g++ against emulation/cuda_runtime.h; under the
    sanitizer `sanitize` ("thread" or "address") if given."""
    library = os.path.join(folder, "librollout_kernels_emulated.so")
    command = ["g++", "-x", "c++", "-std=c++20", "-shared", "-fPIC", "-pthread", *sample_threads_define(sample_threads),
               "-I", os.path.join(GPU_DIR, "emulation"), os.path.join(GPU_DIR, "rollout_kernels.cu"), "-o", library]
    command += ["-O1", "-g", f"-fsanitize={sanitize}"] if sanitize else ["-O2"]
    subprocess.run(command, check=True)
    return library


def sanitizer_runtime(sanitize):
    """The path of g++'s runtime library of `sanitize`, or None where g++ has none."""
    runtime = SANITIZERS[sanitize][0]
    path = subprocess.run(["g++", f"-print-file-name={runtime}"], capture_output=True, text=True, check=True).stdout.strip()
    return path if os.path.isabs(path) else None


def sanitizer_environment(sanitize):
    """This process's environment with g++'s runtime of `sanitize` preloaded: a library built with -fsanitize
    cannot load the runtime itself once the interpreter runs."""
    runtime, variable, options = SANITIZERS[sanitize]
    path = sanitizer_runtime(sanitize)
    if path is None:
        sys.exit(f"g++ has no {runtime}: install its package (Debian: {runtime[:-3]}*)")
    return dict(os.environ, LD_PRELOAD=path, **{variable: options})


def launchers(library):
    """The launchers (C++ names in namespace rollout, found mangled in the library's symbols)."""
    symbols = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in symbols.splitlines()]
    loaded, functions = ctypes.CDLL(library), {}
    for name, argtypes in LAUNCHERS.items():
        mangled = [symbol for symbol in names if f"{len(name)}{name}E" in symbol]
        if len(mangled) != 1:
            raise RuntimeError(f"{name}: expected one symbol in {library}, found {mangled}")
        function = getattr(loaded, mangled[0])
        function.argtypes, function.restype = argtypes, ctypes.c_char_p  # nullptr, or why it did not launch
        functions[name] = function
    return functions


class Kernels:
    """The launchers on a CUDA device: arrays of CuPy (`xp`), passed as device pointers with the current stream."""

    def __init__(self, cp, functions):
        self.xp, self.functions = cp, functions

    def pointer(self, array):
        return int(array.data.ptr)

    def host(self, array):
        return self.xp.asnumpy(array)

    def call(self, name, *args):
        """Run launcher `name` on `args` (arrays of `xp` pass as pointers) and wait for it; stop if its kernel
        did not launch."""
        error = self.run(self.functions[name], [self.pointer(a) if isinstance(a, self.xp.ndarray) else a for a in args])
        if error is not None:
            sys.exit(f"{name}: its kernel did not launch: {error.decode()}")

    def run(self, launcher, values):
        stream = self.xp.cuda.get_current_stream()
        error = launcher(*values, stream.ptr)
        stream.synchronize()
        return error

    def sample(self, logits, temperature, top_k, top_p, step_idx, row_ids, seed):
        xp = self.xp
        rows, vocab = logits.shape
        device = [xp.asarray(logits, dtype=xp.float32), xp.empty((rows, vocab), xp.float32),
                  xp.asarray(temperature, xp.float32), xp.asarray(top_k, xp.int64), xp.asarray(top_p, xp.float32),
                  xp.asarray(step_idx, xp.int64), xp.asarray(row_ids, xp.int64)]
        tokens = xp.full(rows, -2, xp.int64)  # no token, not even the -1 of a row with none: a launch that failed shows
        self.call("LaunchSample", *device, seed, tokens, rows, vocab)
        return self.host(tokens), device


class EmulatedKernels(Kernels):
    """The launchers of the CPU emulation: arrays of NumPy, passed as host pointers; a launch returns when its
    blocks have run, and the stream is ignored."""

    def __init__(self, functions):
        self.xp, self.functions = np, functions

    def pointer(self, array):
        return array.ctypes.data

    def host(self, array):
        return np.array(array)

    def run(self, launcher, values):
        return launcher(*values, None)


MISMATCHES = []  # the labels of the checks that failed: the run goes on, so one run shows every failure


def record(label, passed, detail):
    """Print the outcome of check `label` (with `detail` where it failed) and count a failure; the checks go on."""
    if passed:
        print(f"ok {label}")
    else:
        print(f"MISMATCH {label}: {detail}")
        MISMATCHES.append(label)
    return passed


def check(label, got, expected):
    """Exact equality of `got` and `expected`."""
    got, expected = np.asarray(got), np.asarray(expected)
    equal = np.array_equal(got, expected)
    return record(label, equal, "" if equal else f"{int(np.sum(got != expected))} of {expected.size} entries differ")


def check_penalty(kernels, rng):
    xp = kernels.xp
    rows, vocab, history_len = 8, 1000, 12
    logits = rng.normal(scale=2.0, size=(rows, vocab)).astype(np.float32)
    history = rng.integers(0, 30, size=(rows, history_len))  # repeats
    history[::2, -3:], history[1::2, -2] = -1, vocab + 4  # padding and ids outside the vocabulary: passed over
    step_idx = rng.integers(0, history_len + 3, size=rows)  # beyond the history too
    repetition, frequency, presence = np.full(rows, 1.3, np.float32), np.full(rows, 0.1, np.float32), np.full(rows, 0.2, np.float32)
    min_len, eos, banned = np.full(rows, 6), np.array([3, 7, vocab]), np.array([11, -1])
    expected = reference_penalty(logits, history, step_idx, repetition, frequency, presence, min_len, eos, banned)
    device = xp.array(logits)
    kernels.call("LaunchTokenPenalty", device, xp.empty((rows, vocab), xp.int32), xp.asarray(history, xp.int64),
                 xp.asarray(step_idx, xp.int64), xp.asarray(repetition), xp.asarray(frequency), xp.asarray(presence),
                 xp.asarray(min_len, xp.int64), xp.asarray(eos, xp.int64), len(eos), xp.asarray(banned, xp.int64),
                 len(banned), rows, vocab, history_len)
    label = "token penalty (repetition, frequency, presence, min length, banned ids, ids outside the vocabulary)"
    got = kernels.host(device)
    close = np.allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    record(label, close, "" if close else f"largest difference {np.nanmax(np.abs(got - expected))}")


# (temperature, top_k, top_p) of the sampling checks; the first reaches every barrier of the kernel (both
# threshold searches), the last none past the maximum.
SAMPLING_SETTINGS = [(1.0, 50, 0.95), (1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 20000, 0.8), (0.0, 0, 1.0)]


def check_sampling(kernels, rng, vocab, settings=SAMPLING_SETTINGS):
    rows = 11
    peaked, flat = rng.normal(scale=4.0, size=(3, vocab)), rng.normal(scale=0.02, size=(3, vocab))
    ties = rng.integers(0, 3, size=(2, vocab)) * 0.5
    unsamplable = rng.normal(size=(3, vocab))  # a NaN, a +inf, every logit -inf: each gets NO_TOKEN
    unsamplable[0, vocab // 2], unsamplable[1, vocab // 3], unsamplable[2] = np.nan, np.inf, -np.inf
    logits = np.concatenate([peaked, flat, ties, unsamplable]).astype(np.float32)
    step_idx = rng.integers(0, 100, size=rows)
    row_ids = rng.permutation(100)[:rows]  # rows dropped from a batch keep their ids
    for temperature, top_k, top_p in settings:
        check_draws(f"sampling at vocabulary {vocab}, temperature {temperature}, top_k {top_k}, top_p {top_p}", kernels,
                    logits, temperature, top_k, top_p, step_idx, row_ids, seed=77)


def check_draws(label, kernels, logits, temperature, top_k, top_p, step_idx, row_ids, seed):
    """One sampling call, every row in the same setting, against the reference; a mismatched row's draw is
    explained."""
    per_row = [np.full(len(logits), v) for v in (temperature, top_k, top_p)]
    got, _ = kernels.sample(logits, *per_row, step_idx, row_ids, seed=seed)
    expected = reference_sample(logits, *per_row, step_idx, seed, row_ids)
    if not check(label, got, expected):
        for b in np.nonzero(got != expected)[0]:
            uniform = uniform01(seed, int(row_ids[b]), int(step_idx[b]))
            print("  " + explain_draw(logits[b], temperature, top_k, top_p, uniform, got[b], expected[b]))


def random_rows(rng, rows, vocab):
    """Logits of one of four kinds: normal at a random scale, a few tied values, a sparse distribution
    (probabilities down to subnormal and zero), normal with some entries -inf."""
    kind = rng.integers(4)
    if kind == 0:
        return rng.normal(scale=rng.uniform(0.01, 8), size=(rows, vocab))
    if kind == 1:
        return rng.integers(0, 4, size=(rows, vocab)) * rng.uniform(0.1, 3)
    if kind == 2:
        return np.log(rng.dirichlet(np.full(vocab, 0.05), size=rows) + 1e-30)
    logits = rng.normal(size=(rows, vocab))
    logits[:, rng.integers(0, vocab, 3)] = -np.inf
    return logits


def check_sampling_at_random(kernels, rng, cases):
    """Sampling on `cases` random batches: vocabularies from 2 to 4,000 (rows shorter than the draw's walk, and
    rows not 16-byte aligned, among them), each with a random kind of logits and setting."""
    for case in range(cases):
        rows, vocab = 6, int(rng.integers(2, 4000))
        logits = random_rows(rng, rows, vocab).astype(np.float32)
        temperature, top_p = rng.choice([0.05, 0.5, 1.0, 1.7]), rng.choice([1.0, 0.99, 0.5, 0.1, 1e-6])
        top_k = rng.choice([0, 1, 2, 7, vocab - 1, vocab, vocab + 3])
        check_draws(f"random batch {case}: vocabulary {vocab}, temperature {temperature}, top_k {top_k}, top_p {top_p}",
                    kernels, logits, temperature, top_k, top_p, rng.integers(0, 1000, rows), rng.integers(0, 1000, rows),
                    seed=case)


def explain_draw(row, temperature, top_k, top_p, uniform, got, expected):
    """Where a row's draw fell in the reference's kept mass, to tell a wrong kernel from a draw that lands
    within rounding of a token boundary (a GPU's expf may differ from NumPy's exp in the last bits)."""
    if temperature <= 0 or min(got, expected) < 0:  # greedy, or a row with nothing to sample from
        return f"got token {got}, expected {expected}: logits {[row[t] for t in (got, expected) if t >= 0]}"
    keep, probs = reference_keep_mask(row, temperature, top_k, top_p)
    mass = np.where(keep, probs, 0.0).astype(np.float64)
    cumulative = np.cumsum(mass) / mass.sum()
    edges = [cumulative[t - 1] if t > 0 else 0.0 for t in (expected, expected + 1)]
    return (f"got token {got} (kept: {bool(keep[got]) if 0 <= got < len(keep) else 'no token'}), expected {expected}; "
            f"the draw {uniform:.9f} is {min(abs(uniform - e) for e in edges):.2e} of the mass from the expected "
            f"token's edges; {int(keep.sum())} tokens kept")


def check_bookkeeping(kernels):
    xp = kernels.xp
    history, step_idx = xp.full((3, 4), -1, xp.int64), xp.asarray([0, 2, 4], xp.int64)
    kernels.call("LaunchSaveStep", history, step_idx, xp.asarray([5, 6, 7], xp.int64), xp.asarray([False, True, False]), 3, 4)
    check("save_step", kernels.host(history), [[5, -1, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]])
    check("save_step counts", kernels.host(step_idx), [1, 2, 4])
    tokens, flags = xp.asarray([3, 9, 4, 5, 6], xp.int64), xp.asarray([False, False, True, False, False])
    running = xp.zeros(1, xp.bool_)
    kernels.call("LaunchUpdateStop", tokens, flags, xp.asarray([1, 1, 1, 8, 2], xp.int64), xp.asarray([9, 5], xp.int64),
                 2, 8, 0, running, 5)
    check("update_stop tokens", kernels.host(tokens), [3, 9, 0, 5, 6])
    check("update_stop flags", kernels.host(flags), [False, True, True, True, False])
    check("update_stop any running", kernels.host(running), [True])
    check_bookkeeping_at_scale(kernels, np.random.default_rng(1))


def check_bookkeeping_at_scale(kernels, rng, rows=3000, history_len=6):
    """Both ops on more rows than a block has threads (save_step's several blocks, update_stop's one block of
    1,024 walking the rows), against the references. The ops write in place: the arrays they get are copies
    (xp.array), since NumPy's asarray would hand the emulation the references' own inputs."""
    xp = kernels.xp
    history, step_idx, tokens, stop_flags, eos_ids = bookkeeping_batch(rng, rows, history_len)
    device = [xp.array(history, xp.int64), xp.array(step_idx, xp.int64)]
    kernels.call("LaunchSaveStep", *device, xp.array(tokens, xp.int64), xp.array(stop_flags), rows, history_len)
    expected = reference_save_step(history, step_idx, tokens, stop_flags)
    check(f"save_step at {rows} rows", kernels.host(device[0]), expected[0])
    check(f"save_step counts at {rows} rows", kernels.host(device[1]), expected[1])
    for flags in (stop_flags, np.ones(rows, bool)):  # some rows running, then none
        got = [xp.array(tokens, xp.int64), xp.array(flags), xp.zeros(1, xp.bool_)]
        kernels.call("LaunchUpdateStop", got[0], got[1], xp.array(step_idx, xp.int64), xp.array(eos_ids, xp.int64),
                     len(eos_ids), history_len, 0, got[2], rows)
        expected = reference_update_stop(tokens, flags, step_idx, eos_ids, history_len, 0)
        check(f"update_stop tokens at {rows} rows, {int(flags.sum())} stopped before", kernels.host(got[0]), expected[0])
        check(f"update_stop flags at {rows} rows, {int(flags.sum())} stopped before", kernels.host(got[1]), expected[1])
        check(f"update_stop any running at {rows} rows, {int(flags.sum())} stopped before", kernels.host(got[2]),
              [expected[2]])


# (top_k, top_p) of the timings: everything kept (GRPO's usual setting), top-p alone, top-k then top-p.
TIMED_SETTINGS = [(0, 1.0), (0, 0.9), (50, 0.95)]


def device_bandwidth(cp):
    """Bytes per second a device-to-device copy of 1 GiB moves, counting bytes read and written."""
    block = cp.ones(2**28, cp.float32)
    copy = cp.empty_like(block)
    copy[...] = block  # the copy kernel compiled and warm
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(10):
        copy[...] = block
    end.record()
    end.synchronize()
    return 2 * block.nbytes * 10 / (cp.cuda.get_elapsed_time(start, end) / 1000)


def time_sampling(kernels, rng, rows, vocab, repeats, bandwidth):
    """Milliseconds per sampling call against one read of the logits at the device's copy bandwidth."""
    cp = kernels.xp
    start, end = cp.cuda.Event(), cp.cuda.Event()
    logits = rng.normal(scale=4.0, size=(rows, vocab)).astype(np.float32)
    floor = 1000 * logits.nbytes / bandwidth
    for top_k, top_p in TIMED_SETTINGS:
        settings = [np.ones(rows), np.full(rows, top_k), np.full(rows, top_p)]
        _, device = kernels.sample(logits, *settings, np.zeros(rows), np.arange(rows), seed=1)
        arguments = [kernels.pointer(a) for a in device]
        tokens, stream = cp.empty(rows, cp.int64), cp.cuda.get_current_stream().ptr
        start.record()
        for _ in range(repeats):
            kernels.functions["LaunchSample"](*arguments, 1, int(tokens.data.ptr), rows, vocab, stream)
        end.record()
        end.synchronize()
        milliseconds = cp.cuda.get_elapsed_time(start, end) / repeats
        print(f"sampling {rows} x {vocab}, top_k {top_k}, top_p {top_p}: {milliseconds:.3f} ms; one read of the "
              f"logits at {bandwidth / 1e9:.0f} GB/s: {floor:.4f} ms ({milliseconds / floor:.0f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 256], help="the batch sizes sampling is timed at")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per setting; 0: no timing")
    parser.add_argument("--random-batches", type=int, default=30, help="random batches sampling is checked on")
    parser.add_argument("--emulate", action="store_true", help="run the kernels on the CPU (g++), not on a GPU")
    parser.add_argument("--sample-threads", type=int, help="the sampling kernel's threads a block, a power of two "
                        f"from 64 to 1024 (default: the kernel's 1024 on a GPU, {EMULATED_SAMPLE_THREADS} emulated)")
    parser.add_argument("--sanitize", choices=sorted(SANITIZERS),
                        help="with --emulate: under ThreadSanitizer (races between a block's threads; it slows "
                             "every barrier of a block's threads, so sampling runs at --vocab only, a small one, "
                             "in the settings that reach every barrier and greedy) or AddressSanitizer (reads and "
                             "writes outside the arrays)")
    args = parser.parse_args()
    if args.sanitize and not args.emulate:
        parser.error("--sanitize needs --emulate")
    if args.sample_threads not in (None, 64, 128, 256, 512, 1024):
        parser.error(f"--sample-threads {args.sample_threads}: a power of two from 64 to 1024")
    if args.emulate and shutil.which("g++") is None:
        sys.exit("--emulate needs g++")
    if args.sanitize and SANITIZERS[args.sanitize][0][:-3] not in os.environ.get("LD_PRELOAD", ""):
        os.execve(sys.executable, [sys.executable, *sys.argv], sanitizer_environment(args.sanitize))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        if args.emulate:
            threads = args.sample_threads or EMULATED_SAMPLE_THREADS
            kernels = EmulatedKernels(launchers(build_emulated_library(folder, args.sanitize, threads)))
            print(f"device: the CPU, emulating CUDA (sampling blocks of {threads} threads)"
                  + (f" under the {args.sanitize} sanitizer" if args.sanitize else ""))
        else:
            import cupy as cp

            arch = f"sm_{cp.cuda.Device().compute_capability}"
            kernels = Kernels(cp, launchers(build_library(folder, arch, args.sample_threads)))
            threads = args.sample_threads or "the kernel's 1024"
            print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()} (sampling blocks of {threads} threads)")
        check_penalty(kernels, rng)
        if args.sanitize == "thread":  # every barrier is slow under it: the settings that reach them all
            check_sampling(kernels, rng, args.vocab, [SAMPLING_SETTINGS[0], SAMPLING_SETTINGS[-1]])
        else:
            for vocab in (5, 50, args.vocab):
                check_sampling(kernels, rng, vocab)
            check_sampling_at_random(kernels, rng, args.random_batches)
        check_bookkeeping(kernels)
        if not args.emulate and args.repeats > 0:
            bandwidth = device_bandwidth(kernels.xp)
            for rows in args.rows:
                time_sampling(kernels, rng, rows, args.vocab, args.repeats, bandwidth)
    if MISMATCHES:
        sys.exit(f"{len(MISMATCHES)} checks failed: {'; '.join(MISMATCHES)}")
    print(f"kernels_checked={len(LAUNCHERS)}")


if __name__ == "__main__":
    main()
