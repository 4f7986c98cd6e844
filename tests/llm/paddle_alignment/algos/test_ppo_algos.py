"""PPO's pieces (GAE, clipped value loss), the reward-model losses, DAPO's group filter, the missing-EOS
penalty and the step metrics, against NumPy loops and numbers worked out by hand."""

import math

import numpy as np
import paddle
import pytest

from helpers import numpy_gae
from paddle_alignment.algos import ADVANTAGE_ESTIMATORS, PAIRWISE_LOSSES
from paddle_alignment.algos.losses import clipped_value_loss
from paddle_alignment.algos.metrics import explained_variance, rlhf_objective_metrics
from paddle_alignment.algos.reward_shaping import groups_with_reward_variance, missing_eos_penalty
from paddle_alignment.experience import Experience


def t(values, dtype="float32"):
    return paddle.to_tensor(values, dtype=dtype)


def test_gae_matches_a_numpy_loop_with_the_kl_penalty_in_the_rewards():
    rng = np.random.default_rng(0)
    lengths = [5, 3, 1, 4]
    mask = np.array([[1.0] * n + [0.0] * (5 - n) for n in lengths], dtype="float32")
    scores = rng.normal(size=4).astype("float32")
    values = rng.normal(size=(4, 5)).astype("float32")
    logprobs, ref_logprobs = rng.normal(size=(2, 4, 5)).astype("float32")
    token_kl = logprobs - ref_logprobs
    gamma, lam, kl_coeff = 0.9, 0.8, 0.1
    token_rewards = -kl_coeff * token_kl * mask
    for row, n in enumerate(lengths):
        token_rewards[row, n - 1] += scores[row]
    expected = numpy_gae(token_rewards, values * mask, lengths, gamma, lam)
    advantages, returns = ADVANTAGE_ESTIMATORS.get("ppo")(
        t(scores), t(mask), t(values), t(logprobs), t(ref_logprobs), kl_coeff=kl_coeff, gamma=gamma, lam=lam,
        normalize_advantage=False,
    )
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(returns.numpy(), (expected + values) * mask, rtol=1e-5, atol=1e-6)


def test_gae_whitens_advantages_over_valid_tokens_only():
    mask = t([[1, 1, 1], [1, 0, 0]])
    advantages, returns = ADVANTAGE_ESTIMATORS.get("ppo")(t([1.0, -2.0]), mask, t([[0.5, 0.1, 0.2], [0.3, 9.0, 9.0]]), lam=1.0)
    valid = advantages.numpy()[mask.numpy() == 1]
    assert abs(valid.mean()) < 1e-5 and valid.std(ddof=1) == pytest.approx(1.0, rel=1e-4)  # verl: unbiased variance
    assert (advantages.numpy()[mask.numpy() == 0] == 0).all()
    # The returns are not whitened: with gamma = lam = 1 they are the reward to go, here the final score.
    np.testing.assert_allclose(returns.numpy(), [[1.0, 1.0, 1.0], [-2.0, 0.0, 0.0]], atol=1e-6)


def test_clipped_value_loss_by_hand():
    # V_old = 0, c = 0.5. Token 1: V = 1, G = 2: unclipped 1, clipped (0.5 - 2)^2 = 2.25 -> 1.125 (clipped wins).
    # Token 2: V = 0.2, G = -1: inside the clip, both 1.44 -> 0.72. Token 3 is padding.
    loss, stats = clipped_value_loss(t([[1.0, 0.2, 7.0]]), t([[0.0, 0.0, 0.0]]), t([[2.0, -1.0, 0.0]]), t([[1, 1, 0]]), 0.5)
    np.testing.assert_allclose(loss.numpy()[0, :2], [1.125, 0.72], rtol=1e-6)
    assert float(stats["val/clipfrac_avg"]) == pytest.approx(0.5)


def test_value_loss_gradient_vanishes_where_the_clipped_term_wins():
    values = t([[1.0, 0.2]])
    values.stop_gradient = False
    loss, _ = clipped_value_loss(values, t([[0.0, 0.0]]), t([[2.0, -1.0]]), t([[1, 1]]), 0.5)
    loss.sum().backward()
    np.testing.assert_allclose(values.grad.numpy(), [[0.0, 1.2]], rtol=1e-6)


def test_sequence_wise_loss_by_hand():
    # End scores: pair 0 better 2 vs worse 1 (at positions 2 and 1), pair 1 better 0 vs worse 1.
    better = t([[9.0, 9.0, 2.0], [0.0, 5.0, 5.0]])
    worse = t([[9.0, 1.0, 7.0], [3.0, 1.0, 5.0]])
    better_mask, worse_mask = t([[1, 1, 1], [1, 0, 0]], "int64"), t([[1, 1, 0], [1, 1, 0]], "int64")
    ids = t([[1, 2, 3], [1, 2, 3]], "int64")
    loss = PAIRWISE_LOSSES.get("sequence-wise")(better, worse, ids, ids, better_mask, worse_mask, regularization=0.1)
    bt = -(math.log(1 / (1 + math.exp(-1.0))) + math.log(1 / (1 + math.exp(1.0)))) / 2
    assert float(loss) == pytest.approx(bt + 0.1 * (4 + 1 + 0 + 1) / 4, rel=1e-6)


def test_token_wise_loss_covers_divergence_to_the_longer_end():
    # Pair: better [5, 6, 7, 8] (length 4), worse [5, 6, 9] (length 3): they diverge at 2 and end at 3.
    better_ids, worse_ids = t([[5, 6, 7, 8]], "int64"), t([[5, 6, 9, 0]], "int64")
    better_mask, worse_mask = t([[1, 1, 1, 1]], "int64"), t([[1, 1, 1, 0]], "int64")
    better, worse = t([[100.0, -100.0, 1.0, 2.0]]), t([[-100.0, 100.0, 0.0, 0.5]])
    loss = PAIRWISE_LOSSES.get("token-wise")(better, worse, better_ids, worse_ids, better_mask, worse_mask, regularization=0.0)
    expected = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(-1.5))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_dynamic_sampling_keeps_groups_whose_rewards_differ():
    rewards = t([1.0, 1.0, 0.0, 2.0, 2.0, 2.0, -1.0, -1.0])
    groups = t([0, 0, 0, 1, 1, 1, 2, 2], "int64")
    np.testing.assert_array_equal(
        groups_with_reward_variance(rewards, groups).numpy(), [True, True, True, False, False, False, False, False]
    )
    # A "group" of one sample has no variance.
    assert not groups_with_reward_variance(t([3.0]), t([0], "int64")).numpy().any()


def test_missing_eos_penalty_by_hand():
    finished = paddle.to_tensor([True, False, True])
    np.testing.assert_allclose(missing_eos_penalty(finished, 1.5).numpy(), [0.0, -1.5, 0.0])


def test_explained_variance_by_hand():
    mask = t([[1, 1, 1, 0]])
    returns = t([[1.0, 2.0, 3.0, 50.0]])
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    assert float(explained_variance(t([[2.0, 2.0, 2.0, 0.0]]), returns, mask)) == pytest.approx(0.0, abs=1e-6)
    # residual [1, 1, 1]: variance 0 as well, the constant offset is not penalised.
    assert float(explained_variance(returns - 1.0, returns, mask)) == pytest.approx(1.0)


def test_rlhf_objective_metrics_by_hand():
    scores = t([1.0, 3.0])
    mask = t([[1, 1], [1, 0]])
    logprobs, ref = t([[-1.0, -2.0], [-0.5, -9.0]]), t([[-1.5, -1.0], [-1.0, 0.0]])
    metrics = rlhf_objective_metrics(scores, mask, logprobs, ref, kl_coeff=0.1)
    # KL per response: 0.5 - 1 = -0.5 and 0.5; entropy estimate: 3 and 0.5.
    assert metrics["objective/kl"] == pytest.approx(0.0)
    assert metrics["objective/entropy"] == pytest.approx(1.75)
    assert metrics["objective/scores"] == pytest.approx(2.0)
    assert metrics["objective/non_score_reward"] == pytest.approx(0.0)
    assert metrics["objective/rlhf_reward"] == pytest.approx(2.0)


def experience(prompt_ids, response_ids, group, reward):
    response_mask = [[1.0 if token else 0.0 for token in row] for row in response_ids]
    return Experience(
        input_ids=t([p + r for p, r in zip(prompt_ids, response_ids)], "int64"),
        attention_mask=t([[1] * len(p) + [int(m) for m in mask] for p, mask in zip(prompt_ids, response_mask)], "int64"),
        response_mask=t(response_mask),
        group_index=t(group, "int64"),
        finished=paddle.to_tensor([True] * len(group)),
        prompts=["p"] * len(group), labels=["l"] * len(group), responses=["r"] * len(group),
        scores=t(reward), rewards=t(reward),
    )


def test_experience_concat_repads_prompts_left_and_responses_right():
    first = experience([[7, 8]], [[5, 0, 0]], [0], [1.0])
    second = experience([[9, 9, 9], [9, 9, 9]], [[4], [3]], [0, 0], [2.0, 3.0])
    merged = Experience.concat([first, second], pad_token_id=0)
    np.testing.assert_array_equal(merged.input_ids.numpy(), [[0, 7, 8, 5, 0, 0], [9, 9, 9, 4, 0, 0], [9, 9, 9, 3, 0, 0]])
    np.testing.assert_array_equal(merged.attention_mask.numpy(), [[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(merged.response_mask.numpy(), [[1, 0, 0], [1, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(merged.group_index.numpy(), [0, 1, 1])
    assert merged.prompt_len == 3 and merged.rewards.numpy().tolist() == [1.0, 2.0, 3.0]
    picked = merged.take([2, 0])
    assert picked.rewards.numpy().tolist() == [3.0, 1.0] and picked.prompts == ["p", "p"]
