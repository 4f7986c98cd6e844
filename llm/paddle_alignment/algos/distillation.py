"""On-policy distillation: a teacher's log-probs of the tokens the student sampled as the training signal.

The student samples, the frozen teacher scores every sampled token, and the student lowers its per-token
reverse KL to the teacher on its own samples (Agarwal et al.'s GKD with lmbda 1; Thinking Machines' and verl's
on-policy distillation). A registered distillation loss maps the student's and the teacher's log-probs of the
sampled tokens [B, R] (an advantage), or their log-probs of the teacher's top tokens at each position [B, R, K]
to a divergence (a loss); its `signal` trait says which (registry.py).
"""

import math

import paddle

from paddle_alignment.algos.registry import ADVANTAGE_ESTIMATORS, DISTILL_LOSSES

# The least mass left to the rest of the vocabulary: a top-k that covers all of it (to float32 rounding) leaves
# this much on both sides, where its terms vanish.
TAIL_FLOOR = 1e-7


def matches_distributions(distill_loss):
    """Whether the distillation loss `distill_loss` compares the teacher's and the student's distributions at each
    position (their log-probs of the teacher's top tokens), not only the sampled tokens' log-probs."""
    return DISTILL_LOSSES.traits(distill_loss).signal == "loss"


@DISTILL_LOSSES.register("reverse_kl", signal="advantage")
def reverse_kl_advantages(logprobs, teacher_logprobs, response_mask):
    """-(log pi_student(x_t) - log pi_teacher(x_t)) on each sampled token x_t: the negated single-sample (k1)
    estimate of KL(student || teacher) at that position, as the token's advantage. The policy gradient of it,
    without a sum over later tokens, is the gradient of the per-token reverse KL (Thinking Machines' discount 0)."""
    return (teacher_logprobs - logprobs) * response_mask.astype(logprobs.dtype)


def with_tail(topk_logprobs):
    """[..., K] log-probs of K tokens -> [..., K + 1]: the rest of the vocabulary as one more outcome, of log-prob
    log(1 - sum of the K probabilities), its mass at least TAIL_FLOOR."""
    covered = paddle.logsumexp(topk_logprobs, axis=-1, keepdim=True).clip(max=math.log1p(-TAIL_FLOOR))
    return paddle.concat([topk_logprobs, paddle.log(-paddle.expm1(covered))], axis=-1)


def kl_divergence(log_p, log_q):
    """KL(p || q) over the last axis, from log-probs."""
    return (log_p.exp() * (log_p - log_q)).sum(axis=-1)


@DISTILL_LOSSES.register("gkd", signal="loss")
def generalized_jsd(student_topk_logprobs, teacher_topk_logprobs, response_mask, distill_beta=0.5):
    """GKD's generalised Jensen-Shannon divergence at each response position [B, R] (Agarwal et al.; TRL's
    `generalized_jsd_loss`): beta KL(T || M) + (1 - beta) KL(S || M) with M = beta T + (1 - beta) S; beta 0 is
    the forward KL(T || S), beta 1 the reverse KL(S || T). T and S are the teacher's and the student's
    distributions over the teacher's top K tokens at the position [B, R, K] plus the rest of the vocabulary as
    one outcome: the divergence of the whole distributions when K covers the vocabulary, a lower bound of it
    otherwise. Differentiated through the student's log-probs."""
    student, teacher = with_tail(student_topk_logprobs), with_tail(teacher_topk_logprobs)
    if distill_beta == 0:
        divergence = kl_divergence(teacher, student)
    elif distill_beta == 1:
        divergence = kl_divergence(student, teacher)
    else:
        mixture = paddle.logsumexp(paddle.stack([student + math.log(1 - distill_beta), teacher + math.log(distill_beta)]), axis=0)
        divergence = distill_beta * kl_divergence(teacher, mixture) + (1 - distill_beta) * kl_divergence(student, mixture)
    return divergence * response_mask.astype(divergence.dtype)


@ADVANTAGE_ESTIMATORS.register("on_policy_distill")
def no_reward_advantages(rewards, response_mask):
    """Pure on-policy distillation: the reward leaves the advantages (zero), so the teacher's signal
    (distill_coeff x the distillation loss's advantages) is all the student learns from; a reward source, when
    the config has one, is only logged."""
    return paddle.zeros(response_mask.shape, dtype=rewards.dtype)
