"""run_kto on the tiny world's pairs made unpaired: it separates the desirable responses from the undesirable ones,
its KL baseline comes from the mismatched sequences, apo_zero_unpaired trains without one, under data parallel
the baseline is averaged over the ranks, and bad configs stop naming the key."""

import json
import os

import numpy as np
import pytest

from helpers import REPO_ROOT, launch_two_processes, preference_argv, train_log
from llm.alignment.kto import run_kto
from paddle_alignment.preference.runs import run

RUN_KTO = os.path.join(REPO_ROOT, "llm", "alignment", "kto", "run_kto.py")


def kto_argv(world, output_dir, **changes):
    return preference_argv(world, output_dir, "kto", **changes)


def train_kto(world, output_dir, **changes):
    trainer = run_kto.build_trainer(kto_argv(world, output_dir, **changes))
    run(trainer)
    return trainer


def eval_results(output_dir):
    return json.loads((output_dir / "eval_results.json").read_text())


def test_kto_separates_desirable_from_undesirable_responses(tiny_world, tmp_path):
    train_kto(tiny_world, tmp_path, max_steps=40, per_device_train_batch_size=32, learning_rate=2e-3)
    results = eval_results(tmp_path)
    assert results["eval_rewards/chosen"] > results["eval_rewards/rejected"] + 0.1
    losses = train_log(tmp_path, "loss")
    assert len(losses) == 40 and np.mean(losses[-5:]) < np.mean(losses[:5])
    # The baseline is a clipped mean log-ratio: 0 at the first step (policy = reference), never negative.
    kl = train_log(tmp_path, "kl")
    assert kl[0] == 0.0 and min(kl) >= 0.0


def test_apo_zero_unpaired_trains_without_a_kl_baseline(tiny_world, tmp_path):
    train_kto(tiny_world, tmp_path, loss_type="apo_zero_unpaired", learning_rate=1e-2)
    assert train_log(tmp_path, "kl") == [0.0, 0.0, 0.0] and np.isfinite(train_log(tmp_path, "loss")).all()


@pytest.mark.parametrize("changes, message", [
    ({"loss_type": "bco"}, "unknown unpaired preference loss \\(loss_type\\) 'bco'"),
    ({"reference_free": True}, "KTO compares every response with the reference"),
    ({"desirable_weight": 0}, "desirable_weight and undesirable_weight must be positive"),
    ({"simpo_gamma": 0.5}, "unknown config key 'simpo_gamma'"),
])
def test_bad_kto_configs_fail_naming_the_key(tiny_world, tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        run_kto.build_trainer(kto_argv(tiny_world, tmp_path, **changes))


@pytest.mark.slow
def test_kto_under_data_parallel_takes_one_kl_baseline_over_the_ranks(tiny_world, tmp_path):
    argv = kto_argv(tiny_world, tmp_path, max_steps=3, learning_rate=1e-2)
    logs = launch_two_processes(argv[0], argv[1:], tmp_path / "log", script=RUN_KTO)
    assert len(logs) == 2
    kl = train_log(tmp_path, "kl")
    assert len(kl) == 3 and kl[0] == 0.0 and kl[-1] >= 0.0
    assert (tmp_path / "config.json").is_file() and eval_results(tmp_path)["eval_loss"] > 0
