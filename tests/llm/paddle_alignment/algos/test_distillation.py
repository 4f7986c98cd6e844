"""On-policy distillation's algorithms (algos/distillation.py) and the policy objective that takes them
(models/ppo_model_utils.py PolicyObjective.distilled): values and gradients against NumPy, and a teacher with
distill_coeff 0 leaving the objective exactly as without one."""

import numpy as np
import paddle
import pytest

from paddle_alignment.algos import ADVANTAGE_ESTIMATORS, DISTILL_LOSSES
from paddle_alignment.models.ppo_model_utils import PolicyObjective

RNG = np.random.default_rng(7)
# float32 values, so that NumPy (float64) and Paddle (float32) start from the same numbers.
STUDENT = np.log(RNG.uniform(0.05, 0.95, size=(3, 5))).astype("float32").astype("float64")
TEACHER = np.log(RNG.uniform(0.05, 0.95, size=(3, 5))).astype("float32").astype("float64")
MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype="float32")
GROUP_ADVANTAGES = np.array([0.5, -1.0, 0.25])[:, None] * MASK


def tensor(values, trainable=False):
    t = paddle.to_tensor(np.asarray(values, dtype="float32"))
    t.stop_gradient = not trainable
    return t


def test_reverse_kl_advantages_are_the_teachers_log_prob_minus_the_students_on_sampled_tokens():
    advantages = DISTILL_LOSSES.get("reverse_kl")(tensor(STUDENT), tensor(TEACHER), tensor(MASK))
    np.testing.assert_allclose(advantages.numpy(), (TEACHER - STUDENT) * MASK, rtol=1e-6, atol=1e-6)
    assert DISTILL_LOSSES.traits("reverse_kl").signal == "advantage"


def test_on_policy_distill_takes_nothing_from_the_reward():
    rewards = tensor([1.0, 0.0, 3.0])
    advantages = ADVANTAGE_ESTIMATORS.get("on_policy_distill")(rewards, tensor(MASK))
    assert advantages.shape == list(MASK.shape) and not advantages.numpy().any()
    assert not ADVANTAGE_ESTIMATORS.traits("on_policy_distill").group_baseline


def numpy_distilled_loss(current, old, teacher, advantages, mask, coeff, low=0.2, high=0.2):
    """The token-mean PPO-clip loss of advantages + coeff x (teacher - old) (NumPy)."""
    total = advantages + coeff * (teacher - old) * mask
    ratio = np.exp(current - old)
    token = np.maximum(-total * ratio, -total * np.clip(ratio, 1 - low, 1 + high))
    return float((token * mask).sum() / mask.sum())


@pytest.mark.parametrize("off_policy", [False, True])
def test_the_policy_loss_with_a_teacher_equals_numpy_in_value_and_gradient(off_policy):
    """On-policy the old log-probs are the detached current ones; off-policy (update_iters > 1, decoupled)
    the behaviour policy's, with ratios inside and outside the clip. The gradient by central differences with
    the old log-probs held (they are detached)."""
    current = (STUDENT + (RNG.normal(0, 0.3, STUDENT.shape) if off_policy else 0.0)).astype("float32").astype("float64")
    old = STUDENT
    objective = PolicyObjective("ppo_clip", "k3", "token-mean", clip_ratio_c=0.0, distill_coeff=0.7)
    logprobs = tensor(current, trainable=True)
    loss, stats = objective.loss(
        logprobs, tensor(np.zeros_like(STUDENT)), tensor(old) if off_policy else None, None,
        tensor(GROUP_ADVANTAGES), tensor(MASK), teacher_logprobs=tensor(TEACHER),
    )
    loss.backward()
    expected = numpy_distilled_loss(current, old, TEACHER, GROUP_ADVANTAGES, MASK, 0.7)
    assert float(loss) == pytest.approx(expected, rel=1e-6, abs=1e-6)
    step, gradient = 1e-3, np.zeros_like(current)
    for index in np.ndindex(current.shape):
        up, down = current.copy(), current.copy()
        up[index] += step
        down[index] -= step
        gradient[index] = (numpy_distilled_loss(up, old, TEACHER, GROUP_ADVANTAGES, MASK, 0.7)
                           - numpy_distilled_loss(down, old, TEACHER, GROUP_ADVANTAGES, MASK, 0.7)) / (2 * step)
    np.testing.assert_allclose(logprobs.grad.numpy(), gradient, rtol=1e-4, atol=1e-6)
    tokens = MASK.sum()
    assert float(stats["distill/reverse_kl"][0] / stats["distill/reverse_kl"][1]) == pytest.approx(((old - TEACHER) * MASK).sum() / tokens, rel=1e-6, abs=1e-6)
    assert float(stats["distill/teacher_logprob_mean"][0]) / tokens == pytest.approx((TEACHER * MASK).sum() / tokens, rel=1e-6, abs=1e-6)


def test_a_teacher_with_distill_coeff_zero_leaves_the_loss_and_gradient_exactly_as_without_one():
    objective = PolicyObjective("ppo_clip", "k3", "token-mean", kl_loss_coeff=0.01, distill_coeff=0.0)
    results = []
    for teacher in (None, tensor(TEACHER)):
        logprobs = tensor(STUDENT, trainable=True)
        loss, stats = objective.loss(logprobs, tensor(np.zeros_like(STUDENT)), None, tensor(TEACHER - 0.1),
                                     tensor(GROUP_ADVANTAGES), tensor(MASK), teacher_logprobs=teacher)
        loss.backward()
        results.append((loss.numpy(), logprobs.grad.numpy(), stats))
    (loss_without, grad_without, stats_without), (loss_with, grad_with, stats_with) = results
    np.testing.assert_array_equal(loss_with, loss_without)
    np.testing.assert_array_equal(grad_with, grad_without)
    assert "distill/reverse_kl" in stats_with and "distill/reverse_kl" not in stats_without


def test_an_unknown_distillation_loss_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"distill_loss.*'reverse_kl'"):
        PolicyObjective(distill_loss="forward_kll")
