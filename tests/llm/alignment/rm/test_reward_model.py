"""Reward-model training on the tiny preference data, and the trained model as PPO's reward."""

import json
import os

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoTokenizer

from helpers import RM_CONFIG, train_reward_model
from llm.alignment.rm import run_reward
from paddle_alignment.experience import Experience
from paddle_alignment.models.loading import frozen, load_score_model
from paddle_alignment.models.score_model import AutoModelForScore
from paddle_alignment.rewards.scoring import RewardModelScorer

CPU_FLOAT32 = type("Args", (), {"fp16_opt_level": "O1", "bf16": False, "fp16": False, "tensor_parallel_degree": -1, "pipeline_parallel_degree": -1, "device": "cpu"})()


@pytest.fixture(scope="module")
def reward_model_dir(tiny_reward_model):
    return tiny_reward_model[0]


def test_reward_model_learns_the_preferences(reward_model_dir):
    model = AutoModelForScore.from_pretrained(reward_model_dir)
    assert model.config.score_type == "reward" and model.config.normalizer_type == "ExponentialMovingAverage"
    # The normalizer tracked the training scores and was saved with the weights.
    assert float(model.normalizer.count) > 0


def test_reward_model_scorer_agrees_with_the_trainers_evaluation(tiny_world, reward_model_dir):
    """RewardModelScorer (PPO's reward) tokenizes prompt + response + EOS as the preference pairs were, so
    its preferences on the eval pairs give exactly the accuracy the trainer reported."""
    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    # Loaded as run_ppo loads its reward model (and run_reward its model): with the CPU kernels the trainer's
    # evaluation ran, so that pairs scored a hair apart compare as they did there.
    model = frozen(load_score_model(reward_model_dir, CPU_FLOAT32))
    rows = [json.loads(line) for line in open(tiny_world["pref_eval"])]
    responses = [answer for row in rows for answer in (row["answer"], row["other_answer"])]
    exp = Experience(
        input_ids=None, attention_mask=None, response_mask=None, group_index=None,
        finished=paddle.to_tensor([True] * len(responses)), prompts=[row["src"] for row in rows for _ in range(2)],
        labels=[""] * len(responses), responses=responses,
    )
    scores = np.array(RewardModelScorer(model, tokenizer, batch_size=7).score(exp).scores).reshape(-1, 2)
    first_is_better = np.array([row["better"] for row in rows])
    better = np.where(first_is_better, scores[:, 0], scores[:, 1])
    worse = np.where(first_is_better, scores[:, 1], scores[:, 0])
    with open(os.path.join(reward_model_dir, "eval_results.json")) as f:
        reported = json.load(f)["eval_accuracy"]
    assert np.mean(better > worse) == pytest.approx(reported)


def test_token_wise_loss_with_score_normalisation_trains(tiny_world, tmp_path):
    metrics = train_reward_model(
        tiny_world, str(tmp_path), loss_type="token-wise", normalize_score_during_training=True,
        normalizer_type="RunningMeanStd", max_steps=20,
    )
    assert np.isfinite(metrics["eval_loss"])
    model = AutoModelForScore.from_pretrained(str(tmp_path))
    assert model.config.do_normalize and model.config.normalizer_type == "RunningMeanStd"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"loss_type": "pointwise"}, "loss_type='pointwise'"),
        ({"normalizer_type": "median"}, "normalizer_type='median'"),
        ({"normalize_score_during_training": True, "normalizer_type": "identity"}, "needs a normalizer_type"),
        ({"regularization": -1}, "regularization must be >= 0"),
        ({"pipeline_parallel_degree": 2}, "pipeline_parallel_degree=2 = 2 ranks per data-parallel replica does not divide the 1"),
        ({"tensor_parallel_degree": 2}, "tensor_parallel_degree=2 = 2 ranks per data-parallel replica does not divide the 1"),
    ],
)
def test_bad_reward_configs_fail_naming_the_key(tmp_path, changes, message):
    argv = [RM_CONFIG, "--model_name_or_path", "unused", "--output_dir", str(tmp_path)]
    argv += [token for key, value in changes.items() for token in (f"--{key}", str(value))]
    with pytest.raises(ValueError, match=message):
        run_reward.build_trainer(argv)
