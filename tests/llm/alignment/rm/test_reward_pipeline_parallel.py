"""run_reward under pipeline parallel: the reward pipe (the score head in place of the LM head, the pairwise loss
on the last stage) trains through paddlenlp's pipeline loop. At PP2 x DP2 it trains as plain data parallel
does on the same batches, the normalizer's statistics (gathered over the last stage's data ranks) included; it
evaluates through the pipeline; its model loads whole; and a run resumed from its checkpoint ends bit for bit
as the uninterrupted run. (PP2 and PP2 x TP2 against TP2 agree too; checked by hand, not in CI.)"""

import json
import os
import shutil

import numpy as np
import paddle
import pytest
from safetensors import safe_open

from helpers import train_reward_model
from paddle_alignment.models.score_model import AutoModelForScore

pytestmark = pytest.mark.slow

# 4 steps of 3 micro-batches of 8 pairs, the token-wise loss, the tiny config's ExponentialMovingAverage normalizer
# updated by every micro-batch; evaluation at the end, 24 pairs a micro-batch (each data rank's 32 pairs: one
# pipeline call of a batch of 24 and one of 8, padded to one width).
CHANGES = {"max_steps": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 3,
           "per_device_eval_batch_size": 24, "logging_steps": 1, "loss_type": "token-wise"}
TOKENS = [[5, 17, 23, 9, 40, 2, 11, 30]]


def losses(output_dir):
    log = (output_dir / "log" / "workerlog.0").read_text()
    return [float(line.split(" - loss: ")[1].split(",")[0]) for line in log.splitlines() if "global_step: " in line]


def scored(folder):
    """The loaded model's scores of a fixed sequence and its normalizer's statistics."""
    model = AutoModelForScore.from_pretrained(str(folder))
    model.eval()
    scores = model(input_ids=paddle.to_tensor(TOKENS, dtype="int64")).scores.numpy()
    return scores, {name: buffer.numpy() for name, buffer in model.normalizer.named_buffers()}


@pytest.fixture(scope="module")
def pipeline_run(tiny_world, tmp_path_factory):
    """run_reward at PP2 x DP2 (4 processes) with a checkpoint at step 2: (its folder, its eval metrics)."""
    folder = tmp_path_factory.mktemp("reward_pipeline") / "pipeline"
    metrics = train_reward_model(tiny_world, str(folder), processes=4, pipeline_parallel_degree=2, save_strategy="steps",
                                 save_steps=2, **CHANGES)
    return folder, metrics


def test_reward_model_training_at_pipeline_by_data_parallel_equals_data_parallel(tiny_world, tmp_path, pipeline_run):
    folder, pipeline = pipeline_run
    plain = train_reward_model(tiny_world, str(tmp_path / "plain"), processes=2, **CHANGES)
    assert "loss: PairwisePipeLoss" in (folder / "log" / "workerlog.0").read_text()
    np.testing.assert_allclose(losses(folder), losses(tmp_path / "plain"), rtol=1e-5)
    assert len(losses(folder)) == 4
    assert pipeline["eval_accuracy"] == plain["eval_accuracy"]
    for key in ("eval_loss", "eval_reward_mean", "eval_reward_std"):
        assert pipeline[key] == pytest.approx(plain[key], rel=1e-4), key
    with open(folder / "config.json") as f:
        assert json.load(f)["architectures"] == ["Qwen2ForScore"]
    (scores, statistics), (plain_scores, plain_statistics) = scored(folder), scored(tmp_path / "plain")
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-4, atol=1e-5)
    assert statistics["count"][0] == 4 * 3 * 2 * 16  # steps x micro-batches x data ranks x sequences
    for name, value in plain_statistics.items():
        np.testing.assert_allclose(statistics[name], value, rtol=1e-5, err_msg=name)


def test_reward_model_training_at_pipeline_parallel_resumes_from_its_checkpoint_exactly(tiny_world, tmp_path, pipeline_run):
    folder, _ = pipeline_run
    checkpoint = folder / "checkpoint-2"
    assert sorted(n for n in os.listdir(checkpoint) if n.endswith(".pdopt")) == ["optimizer.pp00.pdopt", "optimizer.pp01.pdopt"]
    shutil.copytree(checkpoint, tmp_path / "resumed" / "checkpoint-2")
    train_reward_model(tiny_world, str(tmp_path / "resumed"), processes=4, pipeline_parallel_degree=2, save_strategy="steps",
                       save_steps=2, resume_from_checkpoint=tmp_path / "resumed" / "checkpoint-2", **CHANGES)
    assert losses(tmp_path / "resumed") == losses(folder)[2:]
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        with safe_open(str(folder / name), "np") as straight, safe_open(str(tmp_path / "resumed" / name), "np") as resumed:
            assert set(resumed.keys()) == set(straight.keys())
            for key in straight.keys():  # the normalizer's statistics too, with the last stage's weights
                np.testing.assert_array_equal(resumed.get_tensor(key), straight.get_tensor(key), err_msg=key)
