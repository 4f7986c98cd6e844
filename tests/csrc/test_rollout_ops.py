"""The paddlenlp_ops rollout ops (csrc/) against NumPy references, edge cases included; every CUDA source
compiled with nvcc; and the CUDA kernels run against the same references, emulated on the CPU (with
ThreadSanitizer watching their barriers) and on a GPU where there is one."""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import paddle
import pytest

from helpers import REPO_ROOT, built_paddlenlp_ops, required
from paddle_alignment.cpu_runtime import mkl_local_threads, mklml
from paddle_alignment.models.fused_kernels import token_logprobs_and_entropy

sys.path.insert(0, os.path.join(REPO_ROOT, "csrc"))
sys.path.insert(0, os.path.join(REPO_ROOT, "csrc", "gpu"))
import check_kernels  # noqa: E402
from rollout_reference import (  # noqa: E402
    bookkeeping_batch, reference_keep_mask, reference_penalty, reference_sample, reference_save_step,
    reference_update_stop,
)


@pytest.fixture(scope="module")
def ops():
    return built_paddlenlp_ops()


def t(values, dtype):
    return paddle.to_tensor(np.asarray(values), dtype=dtype)


# ---- token penalties -----------------------------------------------------------------------------


def test_penalties_match_numpy_with_repeats_min_length_and_bans(ops):
    rng = np.random.default_rng(0)
    rows, vocab, max_dec = 5, 11, 6
    logits = rng.normal(size=(rows, vocab)).astype(np.float32)
    history = rng.integers(0, 4, size=(rows, max_dec))  # small alphabet: many repeated tokens
    step_idx = np.array([0, 3, 6, 2, 5])
    repetition = np.array([1.0, 1.3, 2.0, 1.0, 1.5], np.float32)
    frequency = np.array([0.0, 0.5, 0.1, 0.2, 0.0], np.float32)
    presence = np.array([0.0, 0.25, 0.0, 0.3, 1.0], np.float32)
    min_len = np.array([1, 5, 2, 0, 9])
    eos_ids, banned = np.array([9, 10]), np.array([7])
    expected = reference_penalty(logits, history, step_idx, repetition, frequency, presence, min_len, eos_ids, banned)
    out = t(logits, "float32")
    ops.rollout_token_penalty(
        out, t(history, "int64"), t(step_idx, "int64"), t(repetition, "float32"), t(frequency, "float32"),
        t(presence, "float32"), t(min_len, "int64"), t(eos_ids, "int64"), t(banned, "int64"),
    )
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    assert np.isneginf(out.numpy()[[0, 1, 4]][:, [9, 10]]).all()  # rows still under min_len
    assert np.isfinite(out.numpy()[[2, 3]][:, [9, 10]]).all()


def test_penalties_pass_over_ids_outside_the_vocabulary(ops):
    # A history's padding (-1) and ids past the vocabulary, in the history, the end ids and the bans; and a
    # step count past the history's length.
    rng = np.random.default_rng(6)
    rows, vocab = 4, 20
    logits = rng.normal(size=(rows, vocab)).astype(np.float32)
    history = np.array([[1, 1, -1, -1, -1, -1], [2, vocab, 2, vocab + 7, 5, 5], [0, 3, 3, 3, 4, -1], [6, 6, 6, 6, 6, 6]])
    step_idx, min_len = np.array([6, 6, 5, 9]), np.array([9, 0, 9, 0])
    penalties = [np.full(rows, v, np.float32) for v in (1.4, 0.3, 0.2)]
    eos_ids, banned = np.array([vocab, 9]), np.array([-1, 11, vocab + 1])
    expected = reference_penalty(logits, history, step_idx, *penalties, min_len, eos_ids, banned)
    out = t(logits, "float32")
    ops.rollout_token_penalty(out, t(history, "int64"), t(step_idx, "int64"), *(t(p, "float32") for p in penalties),
                              t(min_len, "int64"), t(eos_ids, "int64"), t(banned, "int64"))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    assert np.isneginf(out.numpy()[:, 11]).all() and np.isneginf(out.numpy()[[0, 2], 9]).all()


def test_penalty_by_hand(ops):
    # logit 2.0 seen twice: 2.0 / 2 (repetition) - 2 * 0.5 (frequency) - 0.1 (presence) = -0.1;
    # logit -1.0 seen once: -1.0 * 2 - 0.5 - 0.1 = -2.6.
    logits = t([[2.0, -1.0, 3.0]], "float32")
    ops.rollout_token_penalty(
        logits, t([[0, 1, 0]], "int64"), t([3], "int64"), t([2.0], "float32"), t([0.5], "float32"),
        t([0.1], "float32"), t([0], "int64"), t([2], "int64"), t(np.zeros(0), "int64"),
    )
    np.testing.assert_allclose(logits.numpy(), [[-0.1, -2.6, 3.0]], rtol=1e-6)


# ---- sampling ------------------------------------------------------------------------------------


def run_sample(ops, logits, temperature, top_k, top_p, step_idx, seed, row_ids=None):
    rows = len(logits)
    row_ids = np.arange(rows) if row_ids is None else row_ids
    return ops.rollout_sample(
        t(logits, "float32"), t(np.broadcast_to(temperature, rows), "float32"), t(np.broadcast_to(top_k, rows), "int64"),
        t(np.broadcast_to(top_p, rows), "float32"), t(step_idx, "int64"), t(row_ids, "int64"), seed,
    ).numpy()


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 5, 1.0), (1.0, 8, 0.5), (1.0, 0, 1e-6), (1e-4, 0, 1.0), (0.0, 0, 1.0)],
)
def test_sampling_matches_numpy(ops, temperature, top_k, top_p):
    rng = np.random.default_rng(1)
    logits = rng.normal(scale=3.0, size=(64, 50)).astype(np.float32)
    step_idx = rng.integers(0, 100, size=64)
    got = run_sample(ops, logits, temperature, top_k, top_p, step_idx, seed=12345)
    expected = reference_sample(logits, *(np.full(64, v) for v in (temperature, top_k, top_p)), step_idx, 12345)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (0, 0.9), (0, 0.3), (50, 0.95), (20000, 0.8)])
def test_sampling_matches_numpy_at_the_real_vocabulary(ops, top_k, top_p):
    # Qwen2.5's 151,936 entries: peaked rows (a trained model's), flat rows (a random model's: the top-p
    # selection then narrows through several rounds of key bits) and rows of exactly equal values (ties).
    rng = np.random.default_rng(5)
    vocab = 151936
    logits = np.concatenate([
        rng.normal(scale=4.0, size=(3, vocab)), rng.normal(scale=0.02, size=(3, vocab)),
        np.repeat(rng.integers(0, 3, size=(2, vocab)) * 0.5, 1, axis=0),
    ]).astype(np.float32)
    step_idx = rng.integers(0, 100, size=len(logits))
    rows = len(logits)
    got = run_sample(ops, logits, 1.0, top_k, top_p, step_idx, seed=77)
    expected = reference_sample(logits, np.full(rows, 1.0), np.full(rows, top_k), np.full(rows, top_p), step_idx, 77)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 5, 0.9)])
def test_a_row_with_nothing_to_sample_from_gets_token_minus_one(ops, temperature, top_k, top_p):
    # A NaN or +inf logit (a diverged policy), or every logit -inf: -1 (before: greedy took the largest
    # logit but a NaN, sampling the last token, and a row all NaN token 0), the other rows as alone.
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(6, 40)).astype(np.float32)
    logits[1, 7], logits[2, 30], logits[3] = np.nan, np.inf, -np.inf
    logits[4] = np.nan
    logits[5, :-1] = -np.inf  # one token left: it is drawn
    step_idx, settings = np.arange(6), [np.full(6, v) for v in (temperature, top_k, top_p)]
    got = run_sample(ops, logits, temperature, top_k, top_p, step_idx, seed=9)
    np.testing.assert_array_equal(got, [got[0], -1, -1, -1, -1, 39])
    np.testing.assert_array_equal(got, reference_sample(logits, *settings, step_idx, 9))
    alone = run_sample(ops, logits[[0]], temperature, top_k, top_p, step_idx[[0]], seed=9)
    assert got[0] == alone[0] >= 0


def test_tiny_top_p_and_near_zero_temperature_are_greedy(ops):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(32, 40)).astype(np.float32)
    for temperature, top_p in [(1.0, 1e-6), (1e-5, 1.0), (0.0, 0.7)]:
        got = run_sample(ops, logits, temperature, 0, top_p, np.arange(32), seed=3)
        np.testing.assert_array_equal(got, logits.argmax(axis=1))


def test_sampling_is_seeded_and_reproducible(ops):
    logits = np.zeros((16, 1000), np.float32)  # uniform: any difference shows
    steps = np.arange(16)
    first = run_sample(ops, logits, 1.0, 0, 1.0, steps, seed=7)
    np.testing.assert_array_equal(first, run_sample(ops, logits, 1.0, 0, 1.0, steps, seed=7))
    assert (first != run_sample(ops, logits, 1.0, 0, 1.0, steps, seed=8)).any()
    assert (first != run_sample(ops, logits, 1.0, 0, 1.0, steps + 1, seed=7)).any()


def test_a_rows_draw_follows_its_row_id_not_its_place_in_the_batch(ops):
    # The decode loop drops finished rows: the rows left keep their ids, and so their random streams.
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(12, 300)).astype(np.float32)
    steps = rng.integers(0, 50, size=12)
    whole = run_sample(ops, logits, 1.0, 0, 1.0, steps, seed=5)
    kept = np.array([1, 4, 5, 9, 11])
    part = run_sample(ops, logits[kept], 1.0, 0, 1.0, steps[kept], seed=5, row_ids=kept)
    np.testing.assert_array_equal(part, whole[kept])
    np.testing.assert_array_equal(part, reference_sample(logits[kept], *(np.ones(5), np.zeros(5), np.ones(5)), steps[kept], 5, kept))
    assert (part != run_sample(ops, logits[kept], 1.0, 0, 1.0, steps[kept], seed=5)).any()


def test_sampling_frequencies_follow_the_kept_distribution(ops):
    # 40000 draws of one row (a different step each): chi-square against softmax restricted by top-k/top-p.
    logits = np.log(np.array([0.05, 0.3, 0.02, 0.25, 0.2, 0.1, 0.08], np.float32))
    draws = 40000
    got = run_sample(ops, np.tile(logits, (draws, 1)), 1.0, 5, 0.8, np.arange(draws), seed=99)
    keep, probs = reference_keep_mask(logits, 1.0, 5, 0.8)
    # top-k=5 keeps 0.93 of the mass; top-p keeps 0.3 + 0.25 + 0.2 = 0.75 >= 0.8 * 0.93 of it.
    assert keep.tolist() == [False, True, False, True, True, False, False]
    expected = np.where(keep, probs, 0) / np.where(keep, probs, 0).sum() * draws
    observed = np.bincount(got, minlength=len(logits))
    assert observed[~keep].sum() == 0
    chi2 = (((observed - expected) ** 2) / np.where(keep, expected, 1))[keep].sum()
    assert chi2 < 13.82  # 2 degrees of freedom, p = 0.001


def threaded_op_inputs():
    """Logits [9, 40,000], step indices and labels (one of them -100) for threaded_op_results."""
    rng = np.random.default_rng(11)
    rows, vocab = 9, 40000
    logits = rng.normal(scale=2.0, size=(rows, vocab)).astype(np.float32)
    step_idx, labels = rng.integers(0, 100, size=rows), rng.integers(0, vocab, size=rows)
    labels[4] = -100
    return logits, step_idx, labels


def threaded_op_results(ops, logits, step_idx, labels):
    """What the ops that spread their rows over MKL's threads (csrc/common/mkl_threads.h) give: rollout_sample's
    tokens (temperature 0.9, then also top-k 40 and top-p 0.9), and fused_token_logprobs' log-probs, entropies
    and gradient (temperature 0.7)."""
    tokens = [run_sample(ops, logits, 0.9, top_k, top_p, step_idx, seed=21) for top_k, top_p in [(0, 1.0), (40, 0.9)]]
    x = t(logits, "float32")
    x.stop_gradient = False
    logprobs, entropy = token_logprobs_and_entropy(x, t(labels, "int64"), 0.7)
    # The gradient of sum(logprobs) + 0.5 sum(entropy), seeded directly: the op's backward is the only kernel run.
    (grad,) = paddle.grad([logprobs, entropy], [x], [paddle.ones_like(logprobs), paddle.full_like(entropy, 0.5)])
    return tokens + [logprobs.numpy(), entropy.numpy(), grad.numpy()]


def test_sampling_and_token_logprobs_are_the_same_on_one_thread_and_on_two(ops):
    # A row's result must not depend on the thread that computes it, nor on how many there are.
    inputs = threaded_op_inputs()
    with mkl_local_threads(1):
        one = threaded_op_results(ops, *inputs)
    with mkl_local_threads(2):
        assert mklml().MKL_Get_Max_Threads() == 2
        two = threaded_op_results(ops, *inputs)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    logits, step_idx, _ = inputs
    rows = len(logits)
    expected = reference_sample(logits, np.full(rows, 0.9), np.zeros(rows), np.ones(rows), step_idx, 21)
    np.testing.assert_array_equal(two[0], expected)


# A Paddle built without MKL (WITH_MKL=OFF, as for ARM CPUs), played on this one: dlopen refuses Paddle's MKL.
NO_MKL_SHIM = r"""
#include <dlfcn.h>
#include <cstring>
extern "C" void* dlopen(const char* file, int flags) {
  static auto real = reinterpret_cast<void* (*)(const char*, int)>(dlsym(RTLD_NEXT, "dlopen"));
  return file != nullptr && std::strstr(file, "libmklml_intel") != nullptr ? nullptr : real(file, flags);
}
"""

NO_MKL_SCRIPT = """
import sys
import numpy as np
import paddlenlp_ops
from test_rollout_ops import threaded_op_inputs, threaded_op_results
results = threaded_op_results(paddlenlp_ops, *threaded_op_inputs())
assert not any("libmklml_intel" in line for line in open("/proc/self/maps")), "Paddle's MKL was loaded"
np.savez(sys.argv[1], *results)
"""


def test_sampling_and_token_logprobs_run_on_one_thread_where_paddle_has_no_mkl(ops, tmp_path):
    """Without MKL there are no MKL threads to spread rows over: the two ops run on the calling thread and give
    what they give on MKL's two threads."""
    needs_gxx()
    shim, script, saved = tmp_path / "no_mkl.so", tmp_path / "no_mkl.py", tmp_path / "results.npz"
    source = tmp_path / "no_mkl.cc"
    source.write_text(NO_MKL_SHIM)
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", str(source), "-o", str(shim), "-ldl"], check=True)
    script.write_text(NO_MKL_SCRIPT)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join([os.path.join(tests, "csrc"), tests, os.path.join(REPO_ROOT, "llm"), REPO_ROOT])
    env = dict(os.environ, LD_PRELOAD=str(shim), MKL_NUM_THREADS="2", OMP_NUM_THREADS="2", PYTHONPATH=path)
    run = subprocess.run([sys.executable, str(script), str(saved)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    without = np.load(saved)
    with mkl_local_threads(2):
        expected = threaded_op_results(ops, *threaded_op_inputs())
    for index, value in enumerate(expected):
        np.testing.assert_array_equal(without[f"arr_{index}"], value)


# ---- history, stop flags, bookkeeping -----------------------------------------------------------


def test_save_step_writes_active_rows_only(ops):
    history = t(np.full((3, 4), -1), "int64")
    step_idx = t([0, 2, 4], "int64")
    ops.rollout_save_step(history, step_idx, t([5, 6, 7], "int64"), t([False, True, False], "bool"))
    np.testing.assert_array_equal(history.numpy(), [[5, -1, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]])
    np.testing.assert_array_equal(step_idx.numpy(), [1, 2, 4])  # stopped row and full row unchanged


def test_update_stop_with_several_end_ids_pads_finished_rows(ops):
    tokens = t([3, 9, 4, 5, 6], "int64")
    stop_flags = t([False, False, True, False, False], "bool")
    step_idx = t([1, 1, 1, 8, 2], "int64")
    _, _, not_need_stop = ops.rollout_update_stop(tokens, stop_flags, step_idx, t([9, 5], "int64"), 8, 0)
    # Row 1 emits EOS 9, row 3 EOS 5 (and reaches max_dec_len), row 2 was finished: it emits pad 0.
    np.testing.assert_array_equal(tokens.numpy(), [3, 9, 0, 5, 6])
    np.testing.assert_array_equal(stop_flags.numpy(), [False, True, True, True, False])
    assert bool(not_need_stop)


def test_update_stop_reports_when_all_rows_are_finished(ops):
    tokens, flags = t([1, 2], "int64"), t([True, False], "bool")
    _, _, not_need_stop = ops.rollout_update_stop(tokens, flags, t([3, 4], "int64"), t([7], "int64"), 4, 0)
    assert not bool(not_need_stop) and flags.numpy().all()  # row 1 hit max_dec_len
    _, _, not_need_stop = ops.rollout_update_stop(tokens, flags, t([3, 4], "int64"), t([7], "int64"), 4, 0)
    assert not bool(not_need_stop)
    np.testing.assert_array_equal(tokens.numpy(), [0, 0])


def test_save_step_and_update_stop_match_numpy_on_many_rows(ops):
    rng = np.random.default_rng(1)
    rows, history_len = 3000, 6
    history, step_idx, tokens, stop_flags, eos_ids = bookkeeping_batch(rng, rows, history_len)
    got = [t(history, "int64"), t(step_idx, "int64")]
    ops.rollout_save_step(*got, t(tokens, "int64"), t(stop_flags, "bool"))
    for value, expected in zip(got, reference_save_step(history, step_idx, tokens, stop_flags)):
        np.testing.assert_array_equal(value.numpy(), expected)
    for flags in (stop_flags, np.ones(rows, bool)):
        got = [t(tokens, "int64"), t(flags, "bool")]
        _, _, not_need_stop = ops.rollout_update_stop(*got, t(step_idx, "int64"), t(eos_ids, "int64"), history_len, 0)
        expected = reference_update_stop(tokens, flags, step_idx, eos_ids, history_len, 0)
        np.testing.assert_array_equal(got[0].numpy(), expected[0])
        np.testing.assert_array_equal(got[1].numpy(), expected[1])
        assert bool(not_need_stop) == expected[2]


# ---- CUDA sources --------------------------------------------------------------------------------


@pytest.mark.parametrize("source", sorted(glob.glob(os.path.join(REPO_ROOT, "csrc", "**", "*.cu"), recursive=True)))
def test_cuda_sources_compile_with_nvcc(source, tmp_path):
    if shutil.which("nvcc") is None:
        required("nvcc", "nvcc is not installed")
    command = ["nvcc", "-c", "-std=c++17", "-O2", "-arch=sm_90", source, "-o", str(tmp_path / "out.o")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr


def test_the_cuda_kernels_build_into_a_library_with_every_launcher(tmp_path):
    """csrc/gpu/check_kernels.py's build and symbol lookup, which need nvcc but no GPU."""
    if shutil.which("nvcc") is None:
        required("nvcc", "nvcc is not installed")
    functions = check_kernels.launchers(check_kernels.build_library(str(tmp_path), "sm_90"))
    assert sorted(functions) == sorted(check_kernels.LAUNCHERS)


def needs_gxx():
    """Skip (fail in CI) where g++ is missing."""
    if shutil.which("g++") is None:
        required("g++", "g++ is not installed")


def test_the_ops_gpu_glue_compiles_against_paddles_headers_but_for_the_stream():
    """rollout_ops.cc with ROLLOUT_OPS_WITH_CUDA (the ops' calls of the launchers and the checks of what they
    return), which no GPU build has compiled yet, type-checked by g++ against the Paddle headers installed here:
    the CPU build's, which declare Tensor::stream() only for a CUDA build (whose other headers need CUDA's
    libraries), so that is the one error allowed."""
    needs_gxx()
    include = os.path.join(os.path.dirname(paddle.__file__), "include")
    command = ["g++", "-fsyntax-only", "-std=c++17", "-DROLLOUT_OPS_WITH_CUDA", "-I", os.path.join(REPO_ROOT, "csrc"),
               "-I", include, "-I", os.path.join(include, "third_party"), "-I", sysconfig.get_paths()["include"],
               os.path.join(REPO_ROOT, "csrc", "rollout_ops.cc")]
    errors = [line for line in subprocess.run(command, capture_output=True, text=True).stderr.splitlines()
              if ": error:" in line]
    assert len(errors) == 1 and "no member named" in errors[0] and "stream" in errors[0], "\n".join(errors)


def test_a_kernel_that_does_not_launch_is_reported_not_passed_over(tmp_path):
    """A launch a GPU refuses (here sampling blocks of 2,048 threads, over CUDA's 1,024; emulated) writes nothing:
    its launcher returns CUDA's reason, which the check stops on, as the Paddle ops do (rollout_ops.cc)."""
    needs_gxx()
    kernels = check_kernels.EmulatedKernels(
        check_kernels.launchers(check_kernels.build_emulated_library(str(tmp_path), sample_threads=2048)))
    rows = np.ones(2)
    with pytest.raises(SystemExit, match="LaunchSample: its kernel did not launch: invalid configuration argument"):
        kernels.sample(np.zeros((2, 50), np.float32), rows, rows * 0, rows, rows * 0, np.arange(2), seed=1)


CHECK_KERNELS = os.path.join(REPO_ROOT, "csrc", "gpu", "check_kernels.py")


def run_check_kernels(*options, script=CHECK_KERNELS):
    """check_kernels.py --emulate with `options`, of this checkout or of a copy at `script`."""
    return subprocess.run([sys.executable, script, "--emulate", *options], capture_output=True, text=True, timeout=900)


def sanitizer(name):
    """Skip (fail in CI) where g++ or its runtime of sanitizer `name` is missing."""
    needs_gxx()
    if check_kernels.sanitizer_runtime(name) is None:
        required(name, f"g++ has no runtime of the {name} sanitizer")


def test_the_cuda_kernels_match_numpy_emulated_on_the_cpu_and_stay_inside_their_arrays():
    """rollout_kernels.cu built by g++ against csrc/gpu/emulation/cuda_runtime.h (a block's CUDA threads as OS
    threads, __syncthreads() a barrier of them) under AddressSanitizer: every launcher against the NumPy
    references, sampling at Qwen2.5's vocabulary too, with no read or write outside the arrays."""
    sanitizer("address")
    result = run_check_kernels("--sanitize", "address")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ok sampling at vocabulary 151936, temperature 1.3, top_k 20000, top_p 0.8" in result.stdout
    assert "ok sampling at vocabulary 5, temperature 1.0, top_k 0, top_p 1.0" in result.stdout  # never split
    assert "ok random batch 29: vocabulary" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "kernels_checked=4"


@pytest.mark.slow
def test_the_cuda_kernels_run_without_a_race_under_thread_sanitizer():
    sanitizer("thread")
    result = run_check_kernels("--sanitize", "thread", "--vocab", "600")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "kernels_checked=4"


# A defect of each kind put into the sampling kernel, and what its sanitizer must report.
BROKEN_KERNELS = {
    "thread": ("    if (lane == 0) shared[warp] = mass;\n    __syncthreads();\n",  # no barrier before the pieces are read
               "    if (lane == 0) shared[warp] = mass;\n", "ThreadSanitizer: data race"),
    "address": ("for (int64_t v = body + 4 * groups + lane; v < end; v += lanes)",  # one past each range
                "for (int64_t v = body + 4 * groups + lane; v <= end; v += lanes)",
                "AddressSanitizer: heap-buffer-overflow"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_KERNELS))
def test_the_sanitizers_name_the_line_of_a_broken_sampling_kernel(name, tmp_path):
    """The checks can fail: in a copy of csrc/ whose sampling kernel lacks a barrier it needs (between the
    warps' writes of their pieces' mass and every thread's reading them), or reads one entry past a range (the
    last row's logits among them), the emulated run stops at the sanitizer's report, which names the line."""
    sanitizer(name)
    shutil.copytree(os.path.join(REPO_ROOT, "csrc", "gpu"), tmp_path / "gpu")
    shutil.copytree(os.path.join(REPO_ROOT, "csrc", "common"), tmp_path / "common")
    shutil.copy(os.path.join(REPO_ROOT, "csrc", "rollout_reference.py"), tmp_path)
    kernels = tmp_path / "gpu" / "rollout_kernels.cuh"
    sound, broken, report = BROKEN_KERNELS[name]
    assert kernels.read_text().count(sound) == 1
    kernels.write_text(kernels.read_text().replace(sound, broken))
    result = run_check_kernels("--sanitize", name, "--vocab", "600", script=str(tmp_path / "gpu" / "check_kernels.py"))
    assert result.returncode == 66, result.stdout[-3000:] + result.stderr[-3000:]
    assert report in result.stderr and "rollout_kernels.cuh" in result.stderr and "SampleKernel" in result.stderr


def test_the_cuda_kernels_match_numpy_on_a_gpu():
    """csrc/gpu/check_kernels.py itself: needs CuPy and a CUDA device, which CI and the project's CPU machine lack."""
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA device")
    result = subprocess.run([sys.executable, CHECK_KERNELS, "--repeats", "5"], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "kernels_checked=4"
