"""Preference losses of offline alignment without a reward model: DPO and its family (`loss_type` of run_dpo),
KTO (`loss_type` of run_kto), and the NLL term on the chosen responses both can add.

A paired loss takes the log-probs of N chosen and N rejected responses under the policy and under the
reference ([N] each: a response's summed token log-probs, or their mean for the `length_normalized` losses) and
returns the N per-pair losses; `beta` and the other options reach it by name (registry.call_with_options). With
`reference_free` the trainer passes zeros for the reference. The formulas are TRL's (`DPOTrainer`,
`CPOTrainer`, `KTOTrainer`) and PaddleNLP's (`DPOCriterion`, `KTOCriterion`): for each, its docstring names the
source where the two differ.
"""

import paddle
import paddle.nn.functional as F

from paddle_alignment.algos.registry import PREFERENCE_LOSSES, UNPAIRED_PREFERENCE_LOSSES


def smoothed_sigmoid_loss(logits, label_smoothing):
    """-log sigmoid(logits), with a `label_smoothing` share of the pairs taken as flipped (cDPO)."""
    return -F.log_sigmoid(logits) * (1 - label_smoothing) - F.log_sigmoid(-logits) * label_smoothing


def log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected):
    """How much more the policy prefers chosen over rejected than the reference does."""
    return (chosen - ref_chosen) - (rejected - ref_rejected)


@PREFERENCE_LOSSES.register("sigmoid")
def sigmoid_loss(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
    """DPO's Bradley-Terry loss; with label_smoothing > 0, conservative DPO (cDPO)."""
    return smoothed_sigmoid_loss(beta * log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected), label_smoothing)


@PREFERENCE_LOSSES.register("hinge")
def hinge_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """SLiC's hinge on the margin: relu(1 - beta x margin)."""
    return F.relu(1 - beta * log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected))


@PREFERENCE_LOSSES.register("ipo", length_normalized=True)
def ipo_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """IPO (eq. 17, beta as tau): (margin - 1 / (2 beta))^2 on mean token log-probs, as TRL and PaddleNLP."""
    return (log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected) - 1 / (2 * beta)) ** 2


@PREFERENCE_LOSSES.register("robust")
def robust_loss(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
    """Robust DPO (rDPO): the unbiased loss under a `label_smoothing` rate of flipped labels (below 0.5)."""
    logits = beta * log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    return (-(1 - label_smoothing) * F.log_sigmoid(logits) + label_smoothing * F.log_sigmoid(-logits)) / (1 - 2 * label_smoothing)


@PREFERENCE_LOSSES.register("exo_pair")
def exo_pair_loss(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
    """EXO (eq. 16): KL(sigmoid(beta x margin) || [1 - eps, eps]) with eps = label_smoothing (> 0)."""
    logits = beta * log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    log_chosen, log_rejected = F.log_sigmoid(logits), F.log_sigmoid(-logits)
    eps = paddle.to_tensor(label_smoothing, dtype=logits.dtype)
    return F.sigmoid(logits) * (log_chosen - paddle.log1p(-eps)) + F.sigmoid(-logits) * (log_rejected - paddle.log(eps))


@PREFERENCE_LOSSES.register("dpop")
def dpop_loss(chosen, rejected, ref_chosen, ref_rejected, beta, dpop_lambda=50.0):
    """DPO-Positive, as PaddleNLP writes it: DPO's loss plus dpop_lambda x max(0, ref_chosen - chosen), a
    penalty (outside the sigmoid) for letting the chosen response's likelihood fall below the reference's."""
    loss = -F.log_sigmoid(beta * log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected))
    return loss + dpop_lambda * paddle.clip(ref_chosen - chosen, min=0)


@PREFERENCE_LOSSES.register("kto_pair")
def kto_pair_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """HALOs' paired KTO (eq. 7), as PaddleNLP: each side's baseline is the other side's mean log-ratio over
    the micro-batch, clipped at 0; the pair's loss is the mean of its two terms."""
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    chosen_kl, rejected_kl = chosen_ratio.mean().clip(min=0), rejected_ratio.mean().clip(min=0)
    chosen_loss = 1 - F.sigmoid(beta * (chosen_ratio - rejected_kl))
    rejected_loss = 1 - F.sigmoid(beta * (chosen_kl - rejected_ratio))
    return (chosen_loss + rejected_loss) / 2


@PREFERENCE_LOSSES.register("sppo_hard")
def sppo_hard_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """SPPO with hard win probabilities (1 for chosen, 0 for rejected): each log-ratio regressed to +-1/(2 beta)."""
    return (chosen - ref_chosen - 0.5 / beta) ** 2 + (rejected - ref_rejected + 0.5 / beta) ** 2


@PREFERENCE_LOSSES.register("nca_pair")
def nca_pair_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """NCA: raises the chosen response's implicit reward in absolute terms, not only against the rejected."""
    chosen_reward, rejected_reward = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
    return -F.log_sigmoid(chosen_reward) - 0.5 * F.log_sigmoid(-chosen_reward) - 0.5 * F.log_sigmoid(-rejected_reward)


@PREFERENCE_LOSSES.register("bco_pair")
def bco_pair_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """BCO on pairs, as TRL: chosen rewards pushed up and rejected down through separate sigmoids."""
    return -F.log_sigmoid(beta * (chosen - ref_chosen)) - F.log_sigmoid(-beta * (rejected - ref_rejected))


@PREFERENCE_LOSSES.register("apo_zero")
def apo_zero_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """APO-zero (eq. 7): chosen likelihood up, rejected down; for chosen responses better than the model's own."""
    return 1 - F.sigmoid(beta * (chosen - ref_chosen)) + F.sigmoid(beta * (rejected - ref_rejected))


@PREFERENCE_LOSSES.register("apo_down")
def apo_down_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """APO-down (eq. 8): both likelihoods down, the rejected more; for chosen responses worse than the model's own."""
    margin = log_ratio_margin(chosen, rejected, ref_chosen, ref_rejected)
    return F.sigmoid(beta * (chosen - ref_chosen)) + 1 - F.sigmoid(beta * margin)


def sorted_rows(values):
    return paddle.sort(values, axis=0)


@PREFERENCE_LOSSES.register("aot")
def aot_loss(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
    """AOT (paired): the micro-batch's policy log-ratios and reference log-ratios matched by rank after sorting."""
    delta = sorted_rows(chosen - rejected) - sorted_rows(ref_chosen - ref_rejected)
    return smoothed_sigmoid_loss(beta * delta, label_smoothing)


@PREFERENCE_LOSSES.register("aot_pair")
def aot_pair_loss(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
    """AOT (unpaired; TRL's `aot_unpaired`): the chosen and rejected log-ratios matched by rank after sorting."""
    delta = sorted_rows(chosen - ref_chosen) - sorted_rows(rejected - ref_rejected)
    return smoothed_sigmoid_loss(beta * delta, label_smoothing)


@PREFERENCE_LOSSES.register("simpo", reference=False, length_normalized=True)
def simpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta, simpo_gamma=0.5, label_smoothing=0.0):
    """SimPO: beta x (mean log-prob margin) - simpo_gamma, no reference (TRL's CPOTrainer, PaddleNLP)."""
    return smoothed_sigmoid_loss(beta * (chosen - rejected) - simpo_gamma, label_smoothing)


def log1mexp(x):
    """log(1 - exp(x)) for x < 0, accurate near 0 as well as far below it."""
    return paddle.where(x > -0.6931471805599453, paddle.log(-paddle.expm1(x)), paddle.log1p(-paddle.exp(x)))


@PREFERENCE_LOSSES.register("or", reference=False, length_normalized=True)
def odds_ratio_loss(chosen, rejected, ref_chosen, ref_rejected):
    """ORPO's odds-ratio term, as PaddleNLP: -log sigmoid(log odds(chosen) - log odds(rejected)) on mean token
    log-probs. ORPO is this with sft_loss_ratio 1 and pref_loss_ratio its lambda (TRL's beta)."""
    return -F.log_sigmoid((chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected)))


def chosen_nll(chosen_logp_sums, chosen_tokens):
    """The NLL of the chosen responses per token over the micro-batch (PaddleNLP's sft_loss, TRL's rpo_alpha term)."""
    return -chosen_logp_sums.sum() / chosen_tokens.sum().clip(min=1)


@UNPAIRED_PREFERENCE_LOSSES.register("kto")
def kto_loss(desirable, ref_desirable, undesirable, ref_undesirable, kl, beta, desirable_weight=1.0, undesirable_weight=1.0):
    """KTO (eq. 7): per response, 1 - sigmoid(beta x (log-ratio - kl)) if desirable, 1 - sigmoid(beta x (kl -
    log-ratio)) if not, weighted; `kl` is the detached KL baseline (kl_baseline). Returns [desirable + undesirable]."""
    return paddle.concat([
        desirable_weight * (1 - F.sigmoid(beta * (desirable - ref_desirable - kl))),
        undesirable_weight * (1 - F.sigmoid(beta * (kl - (undesirable - ref_undesirable)))),
    ])


@UNPAIRED_PREFERENCE_LOSSES.register("apo_zero_unpaired", kl_baseline=False)
def apo_zero_unpaired_loss(desirable, ref_desirable, undesirable, ref_undesirable, kl, beta, desirable_weight=1.0,
                           undesirable_weight=1.0):
    """APO-zero on unpaired responses (TRL's KTOTrainer): no KL baseline."""
    return paddle.concat([
        desirable_weight * (1 - F.sigmoid(beta * (desirable - ref_desirable))),
        undesirable_weight * F.sigmoid(beta * (undesirable - ref_undesirable)),
    ])


def kl_baseline(policy_logps, reference_logps, mean_over_ranks=None):
    """KTO's reference point: the mean log-ratio of mismatched (prompt, response) pairs over the micro-batch (and
    over the data-parallel ranks with `mean_over_ranks`), detached and clipped at 0 (TRL; PaddleNLP clips only
    when distributed)."""
    kl = (policy_logps - reference_logps).mean().detach()
    if mean_over_ranks is not None:
        kl = mean_over_ranks(kl)
    return kl.clip(min=0)
