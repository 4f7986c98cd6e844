"""Multi-turn trajectories put tool observations (mask 0) between response tokens. Every registered advantage
estimator must give the sampled tokens the advantages (and returns) they get without the observation span:
the recursions skip masked positions rather than restart or discount across them, and the scalar reward sits
on the last sampled token, not at index (mask count - 1). Nor may the observation tokens reach the loss."""

import numpy as np
import paddle
import pytest

from paddle_alignment.algos import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from paddle_alignment.algos.registry import call_with_options
from paddle_alignment.models.ppo_model_utils import PolicyObjective

LENGTHS = [6, 3, 5, 1, 6, 2]  # sampled tokens per row; the batch is right-padded to 6
WIDTH, SPAN = 6, 3


def batch(rng):
    mask = np.array([[1.0] * n + [0.0] * (WIDTH - n) for n in LENGTHS], dtype="float32")
    return {
        "rewards": rng.normal(size=len(LENGTHS)).astype("float32"),
        "response_mask": mask,
        "values": rng.normal(size=mask.shape).astype("float32"),
        "logprobs": -rng.random(mask.shape).astype("float32"),
        "ref_logprobs": -rng.random(mask.shape).astype("float32"),
    }


def with_span(arrays, rng):
    """The batch with SPAN observation positions (mask 0, random values) inserted after each row's
    first sampled token (so inside every row of two or more tokens), and the index of each original column."""
    inserted = {"rewards": arrays["rewards"]}
    for key in ("response_mask", "values", "logprobs", "ref_logprobs"):
        span = np.zeros([len(LENGTHS), SPAN], "float32") if key == "response_mask" else rng.normal(size=[len(LENGTHS), SPAN]).astype("float32")
        inserted[key] = np.concatenate([arrays[key][:, :1], span, arrays[key][:, 1:]], axis=1)
    kept = [0, *range(1 + SPAN, WIDTH + SPAN)]
    return inserted, kept


def estimate(name, arrays):
    tensors = {key: paddle.to_tensor(value) for key, value in arrays.items()}
    result = call_with_options(
        ADVANTAGE_ESTIMATORS.get(name), tensors["rewards"], tensors["response_mask"],
        group_index=paddle.to_tensor([0, 0, 1, 1, 2, 2], dtype="int64"), values=tensors["values"],
        logprobs=tensors["logprobs"], ref_logprobs=tensors["ref_logprobs"], kl_coeff=0.1, gamma=0.9, lam=0.8,
        norm_adv_by_std_in_grpo=True, normalize_advantage=True, reward_kl_estimator="k3",
    )
    return [part.numpy() for part in (result if isinstance(result, tuple) else (result,))]


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_every_estimator_is_unchanged_by_an_inserted_observation_span(name):
    rng = np.random.default_rng(7)
    arrays = batch(rng)
    inserted, kept = with_span(arrays, rng)
    for plain, spanned in zip(estimate(name, arrays), estimate(name, inserted)):
        np.testing.assert_allclose(spanned[:, kept], plain, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(spanned[:, 1 : 1 + SPAN], 0.0)  # nothing on the observation tokens


@pytest.mark.parametrize("policy_loss", POLICY_LOSSES.names())
@pytest.mark.parametrize("loss_agg_mode", LOSS_AGGREGATIONS.names())
def test_observation_tokens_change_neither_the_loss_nor_its_gradient(policy_loss, loss_agg_mode):
    """Whatever the trainer's forward gives an observation token (its log-prob, entropy, the sampler's and the
    reference's log-probs there), the objective, with KL and entropy terms and token TIS on, is the same, and
    no gradient reaches it."""
    rng = np.random.default_rng(3)
    mask = np.ones([3, 8], "float32")
    mask[:, 2:5] = 0.0  # an observation span
    mask[2, 6:] = 0.0  # and padding
    objective = PolicyObjective(
        policy_loss, "k3", loss_agg_mode, kl_loss_coeff=0.1, entropy_coeff=0.01, clip_range_ratio_low=0.2,
        clip_range_ratio_high=0.28, max_dec_len=8, rollout_correction="token_tis",
    )
    base = {name: -rng.random([3, 8]).astype("float32") for name in ("logprobs", "entropy", "old", "ref", "rollout")}
    advantages = paddle.to_tensor(rng.normal(size=[3, 8]).astype("float32") * mask)

    def loss_and_gradient(arrays):
        logprobs = paddle.to_tensor(arrays["logprobs"], stop_gradient=False)
        loss, _ = objective.loss(
            logprobs, paddle.to_tensor(arrays["entropy"]), paddle.to_tensor(arrays["old"]), paddle.to_tensor(arrays["ref"]),
            advantages, paddle.to_tensor(mask), rollout_logprobs=paddle.to_tensor(arrays["rollout"]),
        )
        loss.backward()
        return float(loss), logprobs.grad.numpy()

    changed = {name: np.where(mask > 0, value, value - 50.0 * rng.random([3, 8]).astype("float32")) for name, value in base.items()}
    loss, gradient = loss_and_gradient(base)
    changed_loss, changed_gradient = loss_and_gradient(changed)
    assert np.isfinite(loss) and changed_loss == pytest.approx(loss, rel=1e-6, abs=1e-7)
    np.testing.assert_allclose(changed_gradient, gradient, rtol=1e-6, atol=1e-8)
    assert not gradient[mask == 0].any() and gradient[mask > 0].any()
