"""On-policy distillation: a teacher's log-probs of the tokens the student sampled as the training signal.

The student samples, the frozen teacher scores every sampled token, and the student lowers its per-token
reverse KL to the teacher on its own samples (Agarwal et al.'s GKD with lmbda 1; Thinking Machines' and verl's
on-policy distillation). A registered distillation loss maps the student's and the teacher's log-probs of the
sampled tokens [B, R] to its signal; its `signal` trait says how that signal trains the student (registry.py).
"""

import paddle

from paddle_alignment.algos.registry import ADVANTAGE_ESTIMATORS, DISTILL_LOSSES


@DISTILL_LOSSES.register("reverse_kl", signal="advantage")
def reverse_kl_advantages(logprobs, teacher_logprobs, response_mask):
    """-(log pi_student(x_t) - log pi_teacher(x_t)) on each sampled token x_t: the negated single-sample (k1)
    estimate of KL(student || teacher) at that position, as the token's advantage. The policy gradient of it,
    without a sum over later tokens, is the gradient of the per-token reverse KL (Thinking Machines' discount 0)."""
    return (teacher_logprobs - logprobs) * response_mask.astype(logprobs.dtype)


@ADVANTAGE_ESTIMATORS.register("on_policy_distill")
def no_reward_advantages(rewards, response_mask):
    """Pure on-policy distillation: the reward leaves the advantages (zero), so the teacher's signal
    (distill_coeff x the distillation loss's advantages) is all the student learns from; a reward source, when
    the config has one, is only logged."""
    return paddle.zeros(response_mask.shape, dtype=rewards.dtype)
