"""The CUDA rollout kernels checked on a GPU without Paddle: rollout_kernels.cu compiled by nvcc alone into a
shared library, each launcher run on CuPy arrays of random inputs against the NumPy references
(csrc/rollout_reference.py: the semantics of csrc/README.md and the same counter-based draws as the CPU
ops), then the sampling kernel timed against the GPU's memory bandwidth.

    python csrc/gpu/check_kernels.py [--rows 16] [--vocab 151936] [--repeats 50]

Needs nvcc, CuPy and a CUDA device (the lent GPU machine has them, and no Paddle). Prints one line per
check and `kernels_checked=<n>` last; exits non-zero at the first mismatch. tests/csrc/test_rollout_ops.py
runs it where nvcc, CuPy and a device are present, and skips it elsewhere.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

GPU_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(GPU_DIR))

from rollout_reference import reference_penalty, reference_sample  # noqa: E402

P, I64, U64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
# The launchers of rollout_launchers.h and their argument types (pointers as void*).
LAUNCHERS = {
    "LaunchTokenPenalty": [P, P, P, P, P, P, P, P, P, I64, P, I64, I64, I64, I64, P],
    "LaunchSample": [P, P, P, P, P, P, P, U64, P, I64, I64, P],
    "LaunchSaveStep": [P, P, P, P, I64, I64, P],
    "LaunchUpdateStop": [P, P, P, P, I64, I64, I64, P, I64, P],
}


def build_library(folder, arch):
    """rollout_kernels.cu as a shared library for the GPU architecture `arch` (e.g. sm_90), by nvcc alone."""
    library = os.path.join(folder, "librollout_kernels.so")
    command = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", f"-arch={arch}",
               os.path.join(GPU_DIR, "rollout_kernels.cu"), "-o", library]
    subprocess.run(command, check=True)
    return library


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
        function.argtypes, function.restype = argtypes, None
        functions[name] = function
    return functions


class Kernels:
    def __init__(self, cp, functions):
        self.cp, self.functions = cp, functions

    def call(self, name, *args):
        """Run launcher `name`; CuPy arrays pass as device pointers, then the stream; waits for it."""
        values = [int(a.data.ptr) if isinstance(a, self.cp.ndarray) else a for a in args]
        stream = self.cp.cuda.get_current_stream()
        self.functions[name](*values, stream.ptr)
        stream.synchronize()

    def sample(self, logits, temperature, top_k, top_p, step_idx, row_ids, seed):
        cp = self.cp
        rows, vocab = logits.shape
        device = [cp.asarray(logits, dtype=cp.float32), cp.empty((rows, vocab), cp.float32),
                  cp.asarray(temperature, cp.float32), cp.asarray(top_k, cp.int64), cp.asarray(top_p, cp.float32),
                  cp.asarray(step_idx, cp.int64), cp.asarray(row_ids, cp.int64)]
        tokens = cp.empty(rows, cp.int64)
        self.call("LaunchSample", *device, seed, tokens, rows, vocab)
        return cp.asnumpy(tokens), device


def check(label, got, expected):
    if not np.array_equal(np.asarray(got), np.asarray(expected)):
        mismatched = int(np.sum(np.asarray(got) != np.asarray(expected)))
        sys.exit(f"MISMATCH {label}: {mismatched} of {np.asarray(expected).size} entries differ")
    print(f"ok {label}")


def check_penalty(kernels, rng):
    cp = kernels.cp
    rows, vocab, history_len = 8, 1000, 12
    logits = rng.normal(scale=2.0, size=(rows, vocab)).astype(np.float32)
    history = rng.integers(0, 30, size=(rows, history_len))  # repeats
    step_idx = rng.integers(0, history_len + 1, size=rows)
    repetition, frequency, presence = np.full(rows, 1.3, np.float32), np.full(rows, 0.1, np.float32), np.full(rows, 0.2, np.float32)
    min_len, eos, banned = np.full(rows, 6), np.array([3, 7]), np.array([11])
    expected = reference_penalty(logits, history, step_idx, repetition, frequency, presence, min_len, eos, banned)
    device = cp.asarray(logits)
    kernels.call("LaunchTokenPenalty", device, cp.empty((rows, vocab), cp.int32), cp.asarray(history, cp.int64),
                 cp.asarray(step_idx, cp.int64), cp.asarray(repetition), cp.asarray(frequency), cp.asarray(presence),
                 cp.asarray(min_len, cp.int64), cp.asarray(eos, cp.int64), len(eos), cp.asarray(banned, cp.int64),
                 len(banned), rows, vocab, history_len)
    got = cp.asnumpy(device)
    if not np.allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True):
        sys.exit("MISMATCH token penalty")
    print("ok token penalty (repetition, frequency, presence, min length, banned ids)")


def check_sampling(kernels, rng, vocab):
    rows = 8
    peaked, flat = rng.normal(scale=4.0, size=(3, vocab)), rng.normal(scale=0.02, size=(3, vocab))
    ties = rng.integers(0, 3, size=(2, vocab)) * 0.5
    logits = np.concatenate([peaked, flat, ties]).astype(np.float32)
    step_idx = rng.integers(0, 100, size=rows)
    row_ids = rng.permutation(100)[:rows]  # rows dropped from a batch keep their ids
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 50, 0.95), (1.3, 20000, 0.8), (0.0, 0, 1.0)]:
        settings = [np.full(rows, v) for v in (temperature, top_k, top_p)]
        got, _ = kernels.sample(logits, *settings, step_idx, row_ids, seed=77)
        expected = reference_sample(logits, *settings, step_idx, 77, row_ids)
        check(f"sampling at vocabulary {vocab}, temperature {temperature}, top_k {top_k}, top_p {top_p}", got, expected)


def check_bookkeeping(kernels):
    cp = kernels.cp
    history, step_idx = cp.full((3, 4), -1, cp.int64), cp.asarray([0, 2, 4], cp.int64)
    kernels.call("LaunchSaveStep", history, step_idx, cp.asarray([5, 6, 7], cp.int64), cp.asarray([False, True, False]), 3, 4)
    check("save_step", cp.asnumpy(history), [[5, -1, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]])
    check("save_step counts", cp.asnumpy(step_idx), [1, 2, 4])
    tokens, flags = cp.asarray([3, 9, 4, 5, 6], cp.int64), cp.asarray([False, False, True, False, False])
    running = cp.zeros(1, cp.bool_)
    kernels.call("LaunchUpdateStop", tokens, flags, cp.asarray([1, 1, 1, 8, 2], cp.int64), cp.asarray([9, 5], cp.int64),
                 2, 8, 0, running, 5)
    check("update_stop tokens", cp.asnumpy(tokens), [3, 9, 0, 5, 6])
    check("update_stop flags", cp.asnumpy(flags), [False, True, True, True, False])
    check("update_stop any running", cp.asnumpy(running), [True])


def time_sampling(kernels, rng, rows, vocab, repeats):
    """Milliseconds per sampling call against one read of the logits at the bandwidth a device copy reaches."""
    cp = kernels.cp
    block = cp.ones(2**28, cp.float32)
    copy = cp.empty_like(block)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(10):
        copy[...] = block
    end.record()
    end.synchronize()
    bandwidth = 2 * block.nbytes * 10 / (cp.cuda.get_elapsed_time(start, end) / 1000)  # read + write
    logits = rng.normal(scale=4.0, size=(rows, vocab)).astype(np.float32)
    for top_p in (1.0, 0.9):
        settings = [np.ones(rows), np.zeros(rows), np.full(rows, top_p)]
        _, device = kernels.sample(logits, *settings, np.zeros(rows), np.arange(rows), seed=1)
        tokens = cp.empty(rows, cp.int64)
        start.record()
        for _ in range(repeats):
            kernels.functions["LaunchSample"](*[int(a.data.ptr) for a in device], 1, int(tokens.data.ptr), rows, vocab,
                                              cp.cuda.get_current_stream().ptr)
        end.record()
        end.synchronize()
        milliseconds = cp.cuda.get_elapsed_time(start, end) / repeats
        floor = 1000 * logits.nbytes / bandwidth
        print(f"sampling {rows} x {vocab}, top_p {top_p}: {milliseconds:.3f} ms; one read of the logits at "
              f"{bandwidth / 1e9:.0f} GB/s: {floor:.3f} ms ({milliseconds / floor:.1f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    import cupy as cp

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        arch = f"sm_{cp.cuda.Device().compute_capability}"
        kernels = Kernels(cp, launchers(build_library(folder, arch)))
        print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
        check_penalty(kernels, rng)
        check_sampling(kernels, rng, 50)
        check_sampling(kernels, rng, args.vocab)
        check_bookkeeping(kernels)
        time_sampling(kernels, rng, args.rows, args.vocab, args.repeats)
    print(f"kernels_checked={len(LAUNCHERS)}")


if __name__ == "__main__":
    main()
