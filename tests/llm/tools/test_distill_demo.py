"""The distillation demo (`python -m llm.tools.tiny_demo --distill`) as its stages on the demo's world: GRPO makes
the teacher (config/tiny/grpo_argument.json, the in-process arith rule for the demo's reward server), then
config/tiny/distill_argument.json distils the SFT model from it with no reward, closing at least half the gap
between the student's and the teacher's held-out greedy accuracy (the demo on 2026-11-29: 0.305 -> 0.960, the
teacher 0.995)."""

import os

import pytest

from helpers import REPO_ROOT
from llm.alignment.ppo import run_ppo
from test_preference_demo import greedy_accuracy

GRPO_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")
DISTILL_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "distill_argument.json")


def run(config, **values):
    run_ppo.main([config, *[token for key, value in values.items() for token in (f"--{key}", str(value))]])


@pytest.mark.slow
def test_distillation_from_the_grpo_policy_closes_half_the_gap_without_a_reward(demo_world, tmp_path):
    world = {"actor_model_name_or_path": demo_world["model"], "train_datasets": demo_world["train"], "save_steps": 0}
    run(GRPO_CONFIG, **world, eval_datasets="", use_rm_server=False, use_rule_reward=True, output_dir=tmp_path / "grpo",
        logging_dir=tmp_path / "grpo_vdl")
    run(DISTILL_CONFIG, **world, teacher_model_name_or_path=tmp_path / "grpo" / "policy", output_dir=tmp_path / "distill",
        logging_dir=tmp_path / "distill_vdl")
    before = greedy_accuracy(demo_world["model"], demo_world["eval"], tmp_path / "sft.jsonl")
    teacher = greedy_accuracy(tmp_path / "grpo" / "policy", demo_world["eval"], tmp_path / "teacher.jsonl")
    after = greedy_accuracy(tmp_path / "distill" / "policy", demo_world["eval"], tmp_path / "distilled.jsonl")
    assert teacher > before + 0.3, (before, teacher)
    assert after >= before + 0.5 * (teacher - before), (before, after, teacher)
