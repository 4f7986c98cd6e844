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


# ---- gkd: the generalised JSD over the teacher's top tokens -------------------------------------------------

VOCAB = 7
STUDENT_LOGITS = RNG.normal(0, 1.5, size=(2, 3, VOCAB)).astype("float32").astype("float64")
TEACHER_LOGITS = RNG.normal(0, 1.5, size=(2, 3, VOCAB)).astype("float32").astype("float64")
GKD_MASK = np.array([[1, 1, 0], [1, 1, 1]], dtype="float32")


def numpy_log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def numpy_kl(log_p, log_q):
    return (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)


def numpy_gkd(student_logits, teacher_logits, mask, beta, k):
    """TRL's generalized_jsd_loss per token, on the teacher's top-k tokens plus the rest as one outcome (k = V:
    the whole distributions, TRL's own)."""
    student, teacher = numpy_log_softmax(student_logits), numpy_log_softmax(teacher_logits)
    top = np.argsort(-teacher, axis=-1)[..., :k]
    s, t = np.take_along_axis(student, top, -1), np.take_along_axis(teacher, top, -1)
    if k < VOCAB:
        s = np.concatenate([s, np.log1p(-np.exp(s).sum(-1, keepdims=True))], -1)
        t = np.concatenate([t, np.log1p(-np.exp(t).sum(-1, keepdims=True))], -1)
    if beta == 0:
        div = numpy_kl(t, s)
    elif beta == 1:
        div = numpy_kl(s, t)
    else:
        m = np.logaddexp(s + np.log(1 - beta), t + np.log(beta))
        div = beta * numpy_kl(t, m) + (1 - beta) * numpy_kl(s, m)
    return div * mask


def paddle_gkd(student_logits, beta, k):
    """generalized_jsd as the trainer calls it: the teacher's top-k (topk_logprobs), the student's log-probs of
    those tokens from its logits."""
    from paddle_alignment.models.head_logprobs import topk_logprobs

    teacher_labels = paddle.zeros([2, 3], dtype="int64")
    _, teacher_top, ids = topk_logprobs(tensor(TEACHER_LOGITS), teacher_labels, k)
    student = paddle.take_along_axis(paddle.nn.functional.log_softmax(student_logits, axis=-1), ids, axis=-1)
    return DISTILL_LOSSES.get("gkd")(student, teacher_top, tensor(GKD_MASK), distill_beta=beta)


@pytest.mark.parametrize("k", [VOCAB, 3])
@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 1.0])
def test_gkd_equals_trls_generalized_jsd_in_value_and_gradient(beta, k):
    """k = V: TRL's loss on the whole distributions; k < V: on the top k and the rest, to 1e-6. The gradient with
    respect to the student's logits against central differences of the NumPy formula."""
    logits = tensor(STUDENT_LOGITS, trainable=True)
    divergence = paddle_gkd(logits, beta, k)
    np.testing.assert_allclose(divergence.numpy(), numpy_gkd(STUDENT_LOGITS, TEACHER_LOGITS, GKD_MASK, beta, k), rtol=1e-5, atol=1e-6)
    divergence.sum().backward()
    step, gradient = 1e-4, np.zeros_like(STUDENT_LOGITS)
    for index in np.ndindex(STUDENT_LOGITS.shape):
        up, down = STUDENT_LOGITS.copy(), STUDENT_LOGITS.copy()
        up[index] += step
        down[index] -= step
        gradient[index] = (numpy_gkd(up, TEACHER_LOGITS, GKD_MASK, beta, k).sum()
                           - numpy_gkd(down, TEACHER_LOGITS, GKD_MASK, beta, k).sum()) / (2 * step)
    np.testing.assert_allclose(logits.grad.numpy(), gradient, rtol=1e-4, atol=1e-5)


def test_gkd_is_zero_where_the_student_is_the_teacher():
    assert np.abs(paddle_gkd(tensor(TEACHER_LOGITS), 0.5, 3).numpy()).max() < 1e-6
    assert DISTILL_LOSSES.traits("gkd").signal == "loss"


def test_the_students_top_token_log_probs_from_head_rows_equal_the_whole_logits_in_value_and_gradient():
    """logprobs_at takes log p(ids) from K + 1 head rows and the sampled token's log-prob (head_token_stats, in
    chunks of 2 positions here); a model without a chunkable head takes them from its whole logits and the sampled
    token's log-prob (logprobs_from_label). Both equal log_softmax of the whole logits gathered, and so do the
    hidden states' and the head's gradients (tied [V, H] head and untied [H, V])."""
    from paddle_alignment.models.fused_kernels import token_logprobs_and_entropy
    from paddle_alignment.models.head_logprobs import head_token_stats, logprobs_at, logprobs_from_label

    hidden_values = RNG.normal(0, 1, size=(2, 3, 5)).astype("float32")
    ids = paddle.to_tensor(RNG.integers(0, VOCAB, size=(2, 3, 4)), dtype="int64")
    labels = paddle.to_tensor(RNG.integers(0, VOCAB, size=(2, 3)), dtype="int64")
    weight_values = RNG.normal(0, 1, size=(VOCAB, 5)).astype("float32")
    upstream = RNG.normal(size=(2, 3, 4))  # the backward's seed: a weighted sum of the log-probs
    for transpose in (True, False):
        results = []
        for way in ("head rows", "whole logits", "log_softmax"):
            hidden = tensor(hidden_values, trainable=True)
            weight = tensor(weight_values if transpose else weight_values.T, trainable=True)
            logits = paddle.matmul(hidden, weight, transpose_y=transpose)
            if way == "head rows":
                label_logprobs = head_token_stats(hidden, weight, transpose, labels, 0.8, chunk_tokens=2)[0]
                values = logprobs_at(hidden, weight, transpose, labels, label_logprobs, ids, 0.8)
            elif way == "whole logits":
                label_logprobs = token_logprobs_and_entropy(logits, labels, 0.8)[0]
                label_logits = paddle.take_along_axis(logits, labels.unsqueeze(-1), axis=-1).squeeze(-1)
                values = logprobs_from_label(paddle.take_along_axis(logits, ids, axis=-1), label_logits, label_logprobs, 0.8)
            else:
                values = paddle.take_along_axis(paddle.nn.functional.log_softmax(logits / 0.8, axis=-1), ids, axis=-1)
            (values * tensor(upstream)).sum().backward()
            results.append((values.numpy(), hidden.grad.numpy(), weight.grad.numpy()))
        for way in results[:2]:
            for computed, expected in zip(way, results[2]):
                np.testing.assert_allclose(computed, expected, rtol=1e-5, atol=1e-6)


def test_the_teachers_top_tokens_are_its_most_likely_with_their_log_probs():
    from paddle_alignment.models.head_logprobs import topk_logprobs

    labels = paddle.to_tensor(RNG.integers(0, VOCAB, size=(2, 3)), dtype="int64")
    label_logprobs, top, ids = topk_logprobs(tensor(TEACHER_LOGITS), labels, 3, temperature=0.7)
    expected = numpy_log_softmax(TEACHER_LOGITS / 0.7)
    np.testing.assert_array_equal(ids.numpy(), np.argsort(-expected, axis=-1)[..., :3])
    np.testing.assert_allclose(top.numpy(), np.sort(expected, axis=-1)[..., ::-1][..., :3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(label_logprobs.numpy(), np.take_along_axis(expected, labels.numpy()[..., None], -1)[..., 0], rtol=1e-5, atol=1e-6)
