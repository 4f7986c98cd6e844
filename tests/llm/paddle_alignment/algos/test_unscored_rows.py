"""Rows the reward source could not score leave the algorithms: every advantage estimator gives them nothing and
gives the other rows exactly what it gives them with those rows removed from the batch (their groups' statistics
and the batch's whitening included); DAPO's group filter and the loss's token counts ignore them too."""

import numpy as np
import paddle
import pytest

from paddle_alignment.algos import ADVANTAGE_ESTIMATORS
from paddle_alignment.algos.advantages import AdvantageEstimation, group_stats
from paddle_alignment.algos.reward_shaping import groups_with_reward_variance
from paddle_alignment.experience import Experience

ROWS, WIDTH = 8, 5
UNSCORED = [1, 4, 5]  # group 0 loses one of 4 rows, group 1 two


def batch(unscored=UNSCORED):
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, WIDTH + 1, size=ROWS)
    mask = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype("float32")
    scores = rng.choice([0.0, 1.0, 0.25], size=ROWS).astype("float32")
    scores[unscored] = -1.0  # the rule's min score: must change nothing
    tensor = lambda value, dtype="float32": paddle.to_tensor(value, dtype=dtype)  # noqa: E731
    return Experience(
        input_ids=tensor(np.ones((ROWS, 2 + WIDTH)), "int64"),
        attention_mask=tensor(np.concatenate([np.ones((ROWS, 2)), mask], axis=1), "int64"),
        response_mask=tensor(mask),
        group_index=tensor([0, 0, 0, 0, 1, 1, 1, 1], "int64"),
        finished=paddle.to_tensor([True] * ROWS),
        prompts=["p"] * ROWS, labels=["l"] * ROWS, responses=["r"] * ROWS,
        scores=tensor(scores), rewards=tensor(scores),
        unscored=paddle.to_tensor([row in unscored for row in range(ROWS)]),
        old_logprobs=tensor(rng.normal(size=(ROWS, WIDTH)) * mask),
        ref_logprobs=tensor(rng.normal(size=(ROWS, WIDTH)) * mask),
        values=tensor(rng.normal(size=(ROWS, WIDTH)) * mask),
    )


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_each_estimator_leaves_unscored_rows_out_as_if_they_were_not_in_the_batch(name):
    estimate = AdvantageEstimation(rl_algorithm=name, kl_coeff=0.1, gamma=0.9, normalize_advantage=True)
    exp = batch()
    advantages, returns = estimate(exp)
    kept = [row for row in range(ROWS) if row not in UNSCORED]
    alone = exp.take(kept)
    alone.unscored = None
    expected, expected_returns = estimate(alone)
    assert not np.any(advantages.numpy()[UNSCORED])
    np.testing.assert_allclose(advantages.numpy()[kept], expected.numpy(), rtol=1e-5, atol=1e-6)
    if returns is not None:
        assert not np.any(returns.numpy()[UNSCORED])
        np.testing.assert_allclose(returns.numpy()[kept], expected_returns.numpy(), rtol=1e-5, atol=1e-6)


def test_group_statistics_by_hand_without_the_unscored_row():
    rewards = paddle.to_tensor([1.0, 0.0, -5.0, 0.0, 2.0])
    counts, means, stds = group_stats(rewards, paddle.to_tensor([0, 0, 0, 1, 1]), paddle.to_tensor([True, True, False, True, True]))
    np.testing.assert_allclose(counts.numpy(), [2, 2, 2, 2, 2])
    np.testing.assert_allclose(means.numpy(), [0.5, 0.5, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(stds.numpy(), [np.sqrt(0.5)] * 3 + [np.sqrt(2.0)] * 2, rtol=1e-6)


def test_a_group_whose_only_difference_is_an_unscored_row_has_no_reward_variance():
    rewards = paddle.to_tensor([1.0, 1.0, 0.0, 0.0, 1.0])
    groups = paddle.to_tensor([0, 0, 0, 1, 1])
    scored = paddle.to_tensor([True, True, False, True, True])
    assert groups_with_reward_variance(rewards, groups).numpy().tolist() == [True] * 5
    assert groups_with_reward_variance(rewards, groups, scored).numpy().tolist() == [False, False, False, True, True]


def test_trained_mask_zeroes_only_unscored_rows():
    exp = batch()
    trained = exp.trained_mask.numpy()
    assert not trained[UNSCORED].any()
    kept = [row for row in range(ROWS) if row not in UNSCORED]
    np.testing.assert_array_equal(trained[kept], exp.response_mask.numpy()[kept])
    exp.unscored = paddle.to_tensor([False] * ROWS)
    assert exp.trained_mask is exp.response_mask and exp.scored is None
