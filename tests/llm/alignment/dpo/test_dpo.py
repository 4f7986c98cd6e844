"""run_dpo on the tiny world: it learns the preferences, every loss type trains, the reference options (online,
precomputed and cached, LoRA adapters off, TR-DPO updates) do what they say, a resumed run ends as the
uninterrupted one, packed rows train, and bad configs stop naming the key."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO_ROOT, launch_two_processes, preference_argv, train_log, weights
from llm.alignment.dpo import run_dpo
from paddle_alignment.algos import PREFERENCE_LOSSES
from paddle_alignment.preference.runs import run

RUN_DPO = os.path.join(REPO_ROOT, "llm", "alignment", "dpo", "run_dpo.py")


def dpo_argv(world, output_dir, **changes):
    return preference_argv(world, output_dir, "dpo", **changes)


def train_dpo(world, output_dir, **changes):
    """The trainer after a run_dpo run in this process."""
    trainer = run_dpo.build_trainer(dpo_argv(world, output_dir, **changes))
    run(trainer)
    return trainer


def train_dpo_process(world, output_dir, **changes):
    """run_dpo in a process of its own, as a user runs it (a resume must find the parameter names the checkpoint's
    optimizer states were saved under, which earlier models in this process would have moved on)."""
    argv = dpo_argv(world, output_dir, **changes)
    result = subprocess.run([sys.executable, RUN_DPO, *argv], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def eval_results(output_dir):
    return json.loads((output_dir / "eval_results.json").read_text())


TRL_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
               "logps/rejected", "logits/chosen", "logits/rejected")


def test_dpo_learns_the_preferences_and_logs_trls_metrics(tiny_world, tmp_path):
    train_dpo(tiny_world, tmp_path, max_steps=40, per_device_train_batch_size=32, learning_rate=2e-3)
    assert all(len(train_log(tmp_path, name)) == 40 for name in TRL_METRICS)
    margins, losses = train_log(tmp_path, "rewards/margins"), train_log(tmp_path, "loss")
    assert np.mean(margins[-5:]) > np.mean(margins[:5]) + 0.2 and np.mean(losses[-5:]) < np.mean(losses[:5])
    results = eval_results(tmp_path)
    # Held out, the 2-layer world's SFT model prefers the right sums too (its greedy accuracy: the demo's test).
    assert results["eval_loss"] < 0.67 and results["eval_rewards/margins"] > 0.1
    assert all(f"eval_{name}" in results for name in TRL_METRICS)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "tokenizer_config.json").is_file()


@pytest.mark.parametrize("loss_type", PREFERENCE_LOSSES.names())
def test_every_loss_type_trains_two_steps(tiny_world, tmp_path, loss_type):
    options = {"label_smoothing": 0.1} if loss_type in ("exo_pair", "robust") else {}
    train_dpo(tiny_world, tmp_path, loss_type=loss_type, max_steps=2, per_device_train_batch_size=8, **options)
    losses = train_log(tmp_path, "loss")
    assert len(losses) == 2 and np.isfinite(losses).all()
    # With no reference, the rewards are beta x the policy's log-probs; with one, 0 before the first update.
    if PREFERENCE_LOSSES.traits(loss_type).reference:
        assert train_log(tmp_path, "rewards/chosen")[0] == pytest.approx(0.0, abs=1e-6)


def test_precomputed_reference_trains_as_the_online_one_and_a_second_run_runs_no_reference_forward(tiny_world, tmp_path):
    cache = tmp_path / "cache"
    online = train_dpo(tiny_world, tmp_path / "online")
    first = train_dpo(tiny_world, tmp_path / "first", precompute_ref_log_probs=True, reference_cache_dir=cache)
    assert online.reference.forwards == 3 + 1 and first.reference.forwards > 0  # 3 steps and the final evaluation
    assert len(list(cache.glob("*.npy"))) == 2  # the training and the held-out pairs
    second = train_dpo(tiny_world, tmp_path / "second", precompute_ref_log_probs=True, reference_cache_dir=cache)
    assert second.reference.forwards == 0 and second.reference.model is None
    for name in ("first", "second"):
        for metric in ("loss", "rewards/margins"):
            np.testing.assert_allclose(train_log(tmp_path / name, metric), train_log(tmp_path / "online", metric), atol=1e-5)
    final = {name: weights(str(tmp_path / name)) for name in ("online", "second")}
    for name, value in final["online"].items():
        np.testing.assert_allclose(final["second"][name], value, atol=1e-5, err_msg=name)


def test_changed_data_invalidates_the_cached_reference(tiny_world, tmp_path):
    cache = tmp_path / "cache"
    train_dpo(tiny_world, tmp_path / "first", precompute_ref_log_probs=True, reference_cache_dir=cache, max_steps=1)
    rows = open(tiny_world["dpo_train"]).read().splitlines()
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("\n".join(rows[:-1]) + "\n")
    again = train_dpo(tiny_world, tmp_path / "again", precompute_ref_log_probs=True, reference_cache_dir=cache, max_steps=1,
                      train_dataset_path=fewer)
    assert again.reference.forwards > 0 and len(list(cache.glob("*.npy"))) == 3


def test_with_lora_the_reference_is_the_model_with_its_adapters_off(tiny_world, tmp_path):
    trainer = train_dpo(tiny_world, tmp_path, lora=True, lora_rank=4, max_steps=3, learning_rate=1e-2)
    margins = train_log(tmp_path, "rewards/margins")
    # The adapters start at zero (B = 0): the first step's policy is its reference.
    assert margins[0] == 0.0 and margins[-1] != 0.0
    assert trainer.reference.model is None and (tmp_path / "lora_config.json").is_file()


def test_tr_dpo_moves_the_reference_to_the_policy(tiny_world, tmp_path):
    train_dpo(tiny_world, tmp_path / "updated", ref_model_update_steps=1, learning_rate=1e-2)
    # After each step the reference becomes the policy: every step starts from equal log-probs.
    np.testing.assert_allclose(train_log(tmp_path / "updated", "rewards/margins"), 0.0, atol=1e-6)
    train_dpo(tiny_world, tmp_path / "plain", learning_rate=1e-2)
    assert abs(train_log(tmp_path / "plain", "rewards/margins")[-1]) > 1e-3


def test_a_resumed_run_ends_with_the_weights_of_the_uninterrupted_run_and_its_reference(tiny_world, tmp_path):
    changes = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "overwrite_output_dir": False,
               "ref_model_update_steps": 1, "ref_model_mixup_alpha": 0.5, "learning_rate": 1e-2}
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    train_dpo_process(tiny_world, straight, **changes)
    shutil.copytree(straight / "checkpoint-2", crashed / "checkpoint-2")
    # The command run again finds its output_dir's last checkpoint; TR-DPO's reference (moved halfway to the
    # policy after each step) comes back with it.
    train_dpo_process(tiny_world, crashed, **changes)
    resumed, uninterrupted = weights(str(crashed)), weights(str(straight))
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    assert train_log(crashed, "loss") == train_log(straight, "loss")[2:]


def test_greedy_zero_padding_packs_several_pairs_into_each_row(tiny_world, tmp_path):
    trainer = train_dpo(tiny_world, tmp_path, greedy_zero_padding=True, per_device_train_batch_size=2, max_steps=2, max_seq_len=64)
    pairs = len(trainer.train_dataset.records)
    assert len(trainer.train_dataset) < pairs / 4 and np.isfinite(train_log(tmp_path, "loss")).all()


@pytest.mark.parametrize("changes, message", [
    ({"loss_type": "dpo"}, "unknown preference loss \\(loss_type\\) 'dpo'"),
    ({"beta": 0}, "beta must be positive"),
    ({"loss_type": "exo_pair"}, "exo_pair needs label_smoothing > 0"),
    ({"loss_type": "robust", "label_smoothing": 0.5}, "label_smoothing must lie in \\[0, 0.5\\)"),
    ({"loss_type": "dpop", "reference_free": True}, "reference_free with loss_type=dpop"),
    ({"precompute_ref_log_probs": True, "ref_model_update_steps": 2}, "choose one"),
    ({"lora": True, "ref_model_update_steps": 2}, "no weights of its own"),
    ({"loss_type": "simpo", "precompute_ref_log_probs": True}, "need a reference model"),
    ({"max_prompt_len": 24}, "leaves no room for replies"),
    ({"dev_dataset_path": ""}, "evaluation_strategy=steps needs dev_dataset_path"),
    ({"betta": 0.1}, "unknown config key 'betta'; did you mean 'beta'"),
])
def test_bad_dpo_configs_fail_naming_the_key(tiny_world, tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        run_dpo.build_trainer(dpo_argv(tiny_world, tmp_path, **changes))


@pytest.mark.slow
def test_dpo_at_tensor_parallel_by_data_parallel_equals_data_parallel(tiny_world, tmp_path):
    """run_dpo at TP2 x DP2 against plain data parallel over 2 processes on the same batches, 3 steps: the same
    evaluation and the same final weights (the split model written whole)."""
    for run_name, processes, extra in (("two", 2, []), ("four", 4, ["--tensor_parallel_degree", "2"])):
        argv = dpo_argv(tiny_world, tmp_path / run_name, per_device_train_batch_size=16, eval_steps=3)
        launch_two_processes(argv[0], argv[1:] + extra, tmp_path / run_name / "log", script=RUN_DPO, processes=processes)
    assert "split over 2 tensor-parallel ranks" in (tmp_path / "four" / "log" / "workerlog.0").read_text()
    two, four = eval_results(tmp_path / "two"), eval_results(tmp_path / "four")
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_logps/chosen"):
        assert four[key] == pytest.approx(two[key], rel=1e-5, abs=1e-6), key
    # Adam moves a weight by up to the learning rate a step whatever its gradient's size, so where a gradient is
    # near 0 the split reductions' rounding can turn its sign (as in run_reward's test): nearly every weight agrees
    # to 1e-5, the rest within the 3 steps' reach.
    trained = {name: weights(str(tmp_path / name)) for name in ("two", "four")}
    for name, value in trained["two"].items():
        difference = np.abs(trained["four"][name] - value)
        assert difference.max() < 3 * 2e-3 and (difference > 1e-5).mean() < 1e-3, name
