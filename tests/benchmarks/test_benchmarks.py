"""The benchmark scripts still run against the current trainer and rollout engine (one short pass each)."""

import os
import subprocess
import sys

import pytest
from paddlenlp.transformers import AutoModelForCausalLM

from helpers import REPO_ROOT
from paddle_alignment.models.hf_layout import save_hf_weights


def run_script(*argv, last_line=True):
    """The script's last output line (or, with `last_line` false, its whole output)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1] if last_line else result.stdout


def test_bench_grpo_prints_its_figure(tiny_world):
    last = run_script("benchmarks/bench_grpo.py", "--model", tiny_world["model"], "--steps", "2", "--warmup", "1")
    assert last.startswith("completions_per_s=") and float(last.split("=")[1]) > 0


def test_bench_rollout_correction_prints_its_figure(tiny_world, tmp_path):
    last = run_script("benchmarks/bench_rollout_correction.py", "--model", tiny_world["model"], "--train", tiny_world["train"],
                      "--eval", tiny_world["eval"], "--steps", "2", "--settings", "none,icepop", "--sampler_temperature", "1.5",
                      "--work", str(tmp_path))
    assert last.startswith("min_eval_accuracy=") and 0 <= float(last.split("=")[1]) <= 1


def test_bench_sync_check_prints_its_figure(tiny_world):
    last = run_script("benchmarks/bench_sync_check.py", "--model", tiny_world["model"], "--versions", "2")
    assert last.startswith("check_ms=")
    float(last.split("=")[1])  # a difference of medians: may be negative on two versions of a busy machine


def test_bench_rollout_prints_its_figure():
    last = run_script("benchmarks/bench_rollout.py", "--configs", "tiny", "--repeats", "1", "--rollout_n", "8", "--new_tokens", "16")
    assert last.startswith("speedup_vs_generate=") and float(last.split("=")[1]) > 0


def test_bench_optimizer_prints_its_figure():
    last = run_script("benchmarks/bench_optimizer.py", "--rounds", "1", "--steps", "2", "--layers", "1")
    assert last.startswith("speedup=") and float(last.split("=")[1]) > 0


def test_bench_loading_prints_its_figure(tmp_path):
    last = run_script("benchmarks/bench_loading.py", "--num_layers", "1", "--rounds", "1", "--work_dir", str(tmp_path))
    assert last.startswith("speedup=") and float(last.split("=")[1]) > 0


def test_bench_tp_loading_prints_its_figures(tiny_world, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    save_hf_weights(model, str(tmp_path / "hf"))
    last = run_script("benchmarks/bench_tp_loading.py", "--model", str(tmp_path / "hf"), "--degrees", "1", "2",
                      "--whole_degrees", "--work_dir", str(tmp_path / "work"))
    assert last.startswith("split_peak_gb=") and len(last.split("=")[1].split(",")) == 2


def test_bench_tp_logprobs_prints_its_figure(tmp_path):
    last = run_script("benchmarks/bench_tp_logprobs.py", "--tokens", "64", "--vocab", "512", "--chunk_tokens", "16",
                      "--work_dir", str(tmp_path))
    assert last.startswith("chunked_over_whole_peak=") and float(last.split("=")[1]) > 0


def test_bench_rewards_prints_its_figures():
    last = run_script("benchmarks/bench_rewards.py")
    figures = dict(pair.split("=") for pair in last.split())
    assert float(figures["math_accuracy"]) >= 0.97 and float(figures["math_verify_accuracy"]) < float(figures["math_accuracy"])


@pytest.mark.slow
def test_bench_real_size_prints_its_figures(tmp_path):
    # Qwen2.5-0.5B's vocabulary on one layer, a few tokens: the plumbing of both modes, not their figures (the
    # step with a teacher, which is the step plus the teacher's pass).
    sizes = ["--work", str(tmp_path), "--layers", "1", "--prompts", "1", "--samples", "2", "--prompt_tokens", "12"]
    last = run_script("benchmarks/bench_real_size.py", *sizes, "--mode", "decode", "--new_tokens", "6")
    assert last.startswith("fast_over_bandwidth_limit=") and float(last.split("=")[1]) > 0
    output = run_script("benchmarks/bench_real_size.py", *sizes, "--new_tokens", "4", "--micro_batch", "2", "--teacher_layers", "1",
                        "--distill_loss", "gkd", last_line=False)
    figures = dict(line.split("=") for line in output.splitlines() if line.startswith(("ours_seconds_per_step=", "teacher_share_of_step=")))
    assert float(figures["ours_seconds_per_step"]) > 0 and 0 < float(figures["teacher_share_of_step"]) < 1


def test_bench_distill_prints_its_figures(tiny_world, tmp_path):
    """Two steps of each run, evaluated after each: the plumbing, not the figures (the teacher is the SFT model's
    random start here)."""
    output = run_script("benchmarks/bench_distill.py", "--model", tiny_world["model"], "--teacher", tiny_world["random_model"],
                        "--train", tiny_world["train"], "--eval", tiny_world["eval"], "--every", "1", "--distill_steps", "2",
                        "--grpo_steps", "2", "--work", str(tmp_path), last_line=False)
    lines = output.strip().splitlines()
    figures = dict(pair.split("=") for pair in lines[-1].split())
    assert set(figures) == {"reverse_kl_samples_to_half_gap", "gkd_samples_to_half_gap", "grpo_samples_to_half_gap"}
    assert any(line.startswith("samples | reverse_kl accuracy | gkd accuracy | grpo accuracy") for line in lines)


def test_bench_dpo_prints_its_figures_and_reads_its_reference_cache(tmp_path):
    """Ours only (TRL lives in a virtualenv of its own); with --precompute the measured run reads the cache the
    first run wrote and loads no reference model."""
    output = run_script("benchmarks/bench_dpo.py", "--work", str(tmp_path), "--model", "tiny", "--prompt_tokens", "8",
                        "--response_tokens", "8", "--pairs_per_step", "2", "--micro_batch", "2", "--steps", "1",
                        "--warmup", "1", "--precompute", last_line=False)
    assert "reference model loaded: False, reference forwards: 0" in output
    assert float(output.strip().splitlines()[-1].split("=")[1]) > 0
