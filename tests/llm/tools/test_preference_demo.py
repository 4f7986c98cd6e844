"""The preference demo (`python -m llm.tools.tiny_demo --dpo`) as its stages on the demo's world: DPO with
config/tiny/dpo_argument.json raises the SFT model's held-out greedy accuracy by at least 0.2 (the demo on
2026-11-29: 0.305 -> 0.890; KTO on the same replies unpaired: 0.305 -> 0.855)."""

import json
import os

import pytest

from helpers import REPO_ROOT
from llm.alignment.dpo import run_dpo
from llm.predict import predictor
from paddle_alignment.rewards.arith import arith_reward

DPO_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "dpo_argument.json")


def greedy_accuracy(model_dir, prompts, output):
    predictor.main(["--model_name_or_path", str(model_dir), "--data_file", prompts, "--output_file", str(output),
                    "--batch_size", "200", "--max_length", "8"])
    rows = [json.loads(line) for line in open(output)]
    return sum(arith_reward(row["src"], row["tgt"], row["output"]) for row in rows) / len(rows)


@pytest.mark.slow
def test_dpo_on_the_demos_pairs_raises_held_out_greedy_accuracy(demo_world, tmp_path):
    before = greedy_accuracy(demo_world["model"], demo_world["eval"], tmp_path / "sft.jsonl")
    values = {"model_name_or_path": demo_world["model"], "train_dataset_path": demo_world["dpo_train"],
              "dev_dataset_path": demo_world["dpo_eval"], "output_dir": tmp_path / "dpo", "logging_dir": tmp_path / "vdl"}
    run_dpo.main([DPO_CONFIG, *[token for key, value in values.items() for token in (f"--{key}", str(value))]])
    after = greedy_accuracy(tmp_path / "dpo", demo_world["eval"], tmp_path / "dpo.jsonl")
    assert after >= before + 0.2, (before, after)
