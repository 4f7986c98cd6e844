"""The RL losses computed from model outputs, shared by the plain models (ppo_trainer.py) and the
pipeline-parallel wrappers (model_pp.py), so both train on exactly the same objective; `lm_head_at`, which
has a causal LM's head project only the positions whose logits are used; and `response_token_stats`, the
response tokens' log-probs and entropies taken chunk by chunk from the hidden states (models/head_logprobs.py), rows
of one prompt running its forward once where asked (`shared_prompt_hidden`)."""

import contextlib
import functools
import logging
from dataclasses import asdict, dataclass

import paddle
from paddlenlp.transformers.llama.modeling import LlamaLMHead
from paddlenlp.transformers.qwen2.modeling import Qwen2LMHead

from paddle_alignment.algos import DISTILL_LOSSES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, ROLLOUT_CORRECTIONS
from paddle_alignment.algos.distillation import matches_distributions
from paddle_alignment.algos.losses import LossScale, clipped_value_loss
from paddle_alignment.algos.masked import masked_mean
from paddle_alignment.algos.registry import call_with_options, from_config
from paddle_alignment.algos.rollout_correction import mismatch_metrics, turn_mismatch_metrics
from paddle_alignment.algos.token_stats import position_ids_from_mask
from paddle_alignment.distributed import sliced_by_sharding
from paddle_alignment.models.fused_kernels import token_logprobs_and_entropy
from paddle_alignment.models.head_logprobs import (
    DEFAULT_CHUNK_TOKENS, head_token_stats, head_topk_logprobs, logprobs_at, logprobs_from_label, topk_logprobs,
)
from paddle_alignment.models.shared_prompts import prepare_for_shared_prompts, shared_prompt_groups
from paddle_alignment.models.tensor_parallel import is_dist_tensor

logger = logging.getLogger(__name__)

# paddlenlp's LM heads, whose logits are hidden_states @ weight (transpose_y: the tied [V, H] embedding).
HEAD_CLASSES = (Qwen2LMHead, LlamaLMHead)


@dataclass(frozen=True)
class PolicyObjective:
    """pg_loss_coeff x policy loss plus kl_loss_coeff x KL to the reference minus entropy_coeff x entropy, aggregated over
    response tokens with `loss_agg_mode`. Log-probs, KL and entropy are those of the sampling distribution
    softmax(logits / temperature). Given the sampler's log-probs, the policy loss of each token is weighted
    by the `rollout_correction` (algos/rollout_correction.py; "": unweighted), and the gap between sampler
    and trainer is measured (`rollout_corr/*`).

    The fields are the config keys of the same names (`from_args`); the registered policy loss takes those it
    names as parameters (clip_range_ratio_low, sapo_tau_pos, ...), so a new loss with new options is a
    registered function and its keys here and in the config."""

    policy_loss: str = "ppo_clip"
    kl_estimator: str = "k3"
    loss_agg_mode: str = "token-mean"
    kl_loss_coeff: float = 0.0
    entropy_coeff: float = 0.0
    clip_range_ratio_low: float = 0.2
    clip_range_ratio_high: float = 0.2
    clip_ratio_c: float = 0.0
    temperature: float = 1.0
    pg_loss_coeff: float = 1.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    max_dec_len: int = None  # the response budget of a micro-batch that is its own step (pipeline parallel)
    rollout_correction: str = ""
    rollout_is_threshold: float = 2.0
    rollout_is_threshold_lower: float = 0.5
    max_turns: int = 1  # of multi-turn trajectories: the turns the mismatch is measured per
    distill_coeff: float = 0.0
    distill_loss: str = "reverse_kl"
    distill_beta: float = 0.5

    @classmethod
    def from_args(cls, args):
        """The objective of the run's config: each field from the key of its name."""
        return from_config(cls, args)

    def __post_init__(self):
        for name, registry in (("policy_loss", POLICY_LOSSES), ("kl_estimator", KL_ESTIMATORS), ("loss_agg_mode", LOSS_AGGREGATIONS),
                               ("distill_loss", DISTILL_LOSSES)):
            registry.get(getattr(self, name))  # an unknown name stops here, naming its key's choices
        if self.rollout_correction:
            ROLLOUT_CORRECTIONS.get(self.rollout_correction)

    def kl_fn(self, logprobs, ref_logprobs):
        return KL_ESTIMATORS.get(self.kl_estimator)(logprobs, ref_logprobs)

    def aggregate(self, values, mask, scale=None):
        return LOSS_AGGREGATIONS.get(self.loss_agg_mode)(values, mask, scale)

    def token_logprobs(self, logits, labels):
        """log pi(labels) [B, R] under the sampling distribution: the one formula of old, reference and
        current log-probs."""
        return token_logprobs_and_entropy(logits, labels, self.temperature)[0]

    def __call__(self, logits, labels, old_logprobs, ref_logprobs, advantages, response_mask, scale=None,
                 rollout_logprobs=None, turn_ids=None):
        """`logits` [B, R, V] predict the response tokens `labels` [B, R]; see `loss`."""
        logprobs, token_entropy = token_logprobs_and_entropy(logits, labels, self.temperature)
        return self.loss(logprobs, token_entropy, old_logprobs, ref_logprobs, advantages, response_mask, scale,
                         rollout_logprobs, turn_ids)

    def loss(self, logprobs, token_entropy, old_logprobs, ref_logprobs, advantages, response_mask, scale=None,
             rollout_logprobs=None, turn_ids=None, teacher_logprobs=None, teacher_topk_logprobs=None,
             student_topk_logprobs=None):
        """The objective from the current log-probs and entropies of the response tokens [B, R] (see
        `response_token_stats`); `old_logprobs` None means on-policy (the detached current log-probs); `scale`
        (a LossScale) makes the loss this micro-batch's share of the optimizer step's (None: the micro-batch
        alone); `rollout_logprobs`: the sampler's (None: no correction, no mismatch metrics); `turn_ids`: each
        token's turn in multi-turn trajectories (the mismatch per turn too); `teacher_logprobs`: a distillation
        teacher's (see `distilled`); `teacher_topk_logprobs`, `student_topk_logprobs` [B, R, K]: the teacher's and
        the student's log-probs of the teacher's top tokens at each position (see `divergence`). Returns (loss, stats)."""
        old_logprobs = logprobs.detach() if old_logprobs is None else old_logprobs
        scale = scale or LossScale.of(response_mask, self.max_dec_len)
        distill_stats = {}
        if teacher_logprobs is not None:
            advantages, distill_stats = self.distilled(advantages, old_logprobs, teacher_logprobs, response_mask)
        token_loss, stats = call_with_options(
            POLICY_LOSSES.get(self.policy_loss), logprobs, old_logprobs, advantages, response_mask, **asdict(self)
        )
        stats |= distill_stats
        if rollout_logprobs is not None:
            token_loss = self.corrected(token_loss, old_logprobs, rollout_logprobs, response_mask, stats)
            if turn_ids is not None:
                with paddle.no_grad():
                    stats |= turn_mismatch_metrics(old_logprobs, rollout_logprobs, response_mask, turn_ids, self.max_turns)
        # The entropy is differentiated only when it is part of the loss.
        if self.entropy_coeff <= 0:
            token_entropy = token_entropy.detach()
        # The aggregations are linear, so the terms are summed per token and aggregated once.
        objective = self.pg_loss_coeff * token_loss if self.pg_loss_coeff != 1.0 else token_loss
        if self.entropy_coeff > 0:
            objective = objective - self.entropy_coeff * token_entropy
        with paddle.no_grad():
            # Like every `loss/*` statistic, this micro-batch's share of the step's value (see LossScale).
            stats["loss/policy_avg"] = self.aggregate(token_loss, response_mask, scale)
            stats["entropy"] = masked_mean(token_entropy, response_mask)
        if student_topk_logprobs is not None:
            objective = self.with_divergence(objective, student_topk_logprobs, teacher_topk_logprobs, response_mask, scale, stats)
        if ref_logprobs is not None:
            token_kl = self.kl_fn(logprobs, ref_logprobs)
            if self.kl_loss_coeff > 0:
                objective = objective + self.kl_loss_coeff * token_kl
            stats["kl"] = self.aggregate(token_kl.detach(), response_mask)
        return self.aggregate(objective, response_mask, scale), stats

    def distilled(self, advantages, old_logprobs, teacher_logprobs, response_mask):
        """The advantages plus distill_coeff x the distillation loss's per-token advantages (algos/distillation.py),
        from the behaviour policy's log-probs `old_logprobs`: the teacher's signal is a reward of the sampled
        tokens, fixed when they were sampled. With distill_coeff 0 they are unchanged (the teacher is only
        measured). Stats: the token means of the sampled tokens' reverse KL and the teacher's log-probs."""
        with paddle.no_grad():
            mask = response_mask.astype(old_logprobs.dtype)
            tokens = mask.sum()
            stats = {
                "distill/reverse_kl": (((old_logprobs - teacher_logprobs) * mask).sum(), tokens),
                "distill/teacher_logprob_mean": ((teacher_logprobs * mask).sum(), tokens),
            }
        if self.distill_coeff and not matches_distributions(self.distill_loss):
            signal = DISTILL_LOSSES.get(self.distill_loss)(old_logprobs, teacher_logprobs, response_mask)
            advantages = advantages + self.distill_coeff * signal
        return advantages, stats

    def with_divergence(self, objective, student_topk_logprobs, teacher_topk_logprobs, response_mask, scale, stats):
        """The per-token objective plus distill_coeff x the distillation loss's divergence between the teacher's
        and the student's distributions at each position (with distill_coeff 0 only measured); `loss/distill`
        its share of the step's loss, `distill/divergence` its token mean."""
        divergence = call_with_options(
            DISTILL_LOSSES.get(self.distill_loss), student_topk_logprobs, teacher_topk_logprobs, response_mask, **asdict(self)
        )
        with paddle.no_grad():
            mask = response_mask.astype(divergence.dtype)
            stats["distill/divergence"] = ((divergence * mask).sum(), mask.sum())
            stats["loss/distill"] = self.distill_coeff * self.aggregate(divergence.detach(), response_mask, scale)
        return objective + self.distill_coeff * divergence if self.distill_coeff else objective

    def corrected(self, token_loss, old_logprobs, rollout_logprobs, response_mask, stats):
        """`token_loss` weighted by the rollout correction of the trainer-vs-sampler log-ratio (unchanged
        without one); the mismatch metrics and the correction's statistics go into `stats`."""
        with paddle.no_grad():
            stats |= mismatch_metrics(old_logprobs, rollout_logprobs, response_mask)
            if not self.rollout_correction:
                return token_loss
            weights, correction_stats = ROLLOUT_CORRECTIONS.get(self.rollout_correction)(
                old_logprobs - rollout_logprobs, response_mask, self.rollout_is_threshold, self.rollout_is_threshold_lower
            )
            stats |= correction_stats | {"rollout_corr/weight_mean": masked_mean(weights, response_mask)}
        return token_loss * weights


def response_values(critic, exp):
    """Critic values of the states before each response token: [B, R] (float32)."""
    scores = critic(input_ids=exp.input_ids, attention_mask=exp.attention_mask).scores[..., 0]
    return scores[:, exp.prompt_len - 1 : -1]


@dataclass(frozen=True)
class ValueObjective:
    """The critic's clipped value loss against the returns, aggregated over response tokens."""

    loss_agg_mode: str = "token-mean"
    clip_range_value: float = 5.0

    @classmethod
    def from_args(cls, args):
        """The objective of the run's config: each field from the key of its name."""
        return from_config(cls, args)

    def __call__(self, values, old_values, returns, response_mask, scale=None):
        token_loss, stats = clipped_value_loss(values, old_values, returns, response_mask, self.clip_range_value)
        loss = LOSS_AGGREGATIONS.get(self.loss_agg_mode)(token_loss, response_mask, scale)
        stats["loss/value_avg"] = loss.detach()
        return loss, stats


def take_positions(x, positions):
    """x[:, positions] for a slice of step 1, as the middle part of paddle.split: its gradient is a concat,
    cheaper on CPU than a slice's (which scatters into zeros)."""
    start, stop, step = positions.indices(x.shape[1])
    if step != 1:
        raise ValueError(f"take_positions takes contiguous positions, not a slice of step {step}")
    if (start, stop) == (0, x.shape[1]):  # all of them: no split, whose empty parts stop a distributed backward
        return x
    return paddle.split(x, [start, stop - start, x.shape[1] - stop], axis=1)[1]


def lm_head_layer(model):
    """The LM head of a causal LM (the sublayer named `lm_head`), under whatever wraps it (paddle.DataParallel,
    LoRAModel, auto-parallel); None if it has none or its head takes sequence-parallel [tokens, hidden] input."""
    head = next((layer for name, layer in model.named_sublayers(include_self=True) if name.split(".")[-1] == "lm_head"), None)
    if head is None or getattr(getattr(head, "config", None), "sequence_parallel", False):
        return None
    return head


@contextlib.contextmanager
def lm_head_at(model, positions):
    """Within, calls of `model` project only hidden_states[:, positions] through its LM head (a forward
    pre-hook on the head, so every wrapper's own forward still runs), and the logits cover those positions
    only: no head FLOPs, logits memory or slice gradient for the others. Yields whether that is so; False
    for a model without a separate LM head (see lm_head_layer), whose logits then cover every position."""
    head = lm_head_layer(model)
    if head is None:
        yield False
        return
    hook = head.register_forward_pre_hook(lambda layer, inputs: (take_positions(inputs[0], positions), *inputs[1:]))
    try:
        yield True
    finally:
        hook.remove()


def response_positions(exp):
    """The positions whose outputs predict the response tokens."""
    return slice(exp.prompt_len - 1, -1)


def model_logits(model, exp):
    """The `logits` output of `model` on `exp`'s prompts + responses, positions counted over real tokens."""
    return model(
        input_ids=exp.input_ids,
        attention_mask=exp.attention_mask,
        position_ids=position_ids_from_mask(exp.attention_mask),
        return_dict=True,
    ).logits


def response_logits(model, exp):
    """Logits that predict each response token: [B, R, V]. The LM head projects those positions only where the
    model has one (with a 152k vocabulary and long prompts, most of its work would be the prompt's)."""
    positions = response_positions(exp)
    with lm_head_at(model, positions) as head_selects:
        logits = model_logits(model, exp)
    return logits if head_selects else logits[:, positions]


def response_labels(exp):
    return exp.input_ids[:, exp.prompt_len :]


def chunkable_lm_head(model):
    """The LM head of `model` when its log-probs can be taken chunk by chunk from the hidden states (a plain
    head whose logits are hidden @ weight as the weight stands outside the head's forward), else None: not a
    head of fleet's model-parallel layers, whose part of the vocabulary needs their own collectives, nor one
    sliced by sharding stage 3 (sliced_by_sharding). A head the tensor-parallel plan split over the vocabulary
    (a distributed weight) is chunkable: Paddle's engine reduces each chunk's softmax over the ranks."""
    head = lm_head_layer(model)
    if type(head) not in HEAD_CLASSES:  # None, or a head with adapters: its logits are not hidden @ weight
        return None
    weight = head.weight
    if weight.is_distributed or sliced_by_sharding(weight):
        return None
    return head


@contextlib.contextmanager
def lm_head_skipped(head, positions):
    """Within, `head` returns its input hidden_states[:, positions] in place of logits."""
    head.forward = lambda hidden_states, *args, **kwargs: take_positions(hidden_states, positions)
    try:
        yield
    finally:
        del head.forward


def response_token_stats(model, exp, temperature=1.0, chunk_tokens=DEFAULT_CHUNK_TOKENS, share_prompts=False, extra_ids=None):
    """(log-probs, entropies) [B, R] of the response tokens under softmax(logits / temperature), with gradients
    when grad is enabled. Where the model's LM head allows (chunkable_lm_head), the head projects only the
    response positions and `chunk_tokens` of them at a time (models/head_logprobs.py): memory does not grow
    with the vocabulary times the batch; and with `share_prompts`, rows with the same prompt run its forward
    once (shared_prompt_hidden). Otherwise from the whole response logits. With `extra_ids` [B, R, K] (a
    distillation teacher's top tokens), a third output: their log-probs [B, R, K]."""
    labels = response_labels(exp)
    head = chunkable_lm_head(model)
    # Not under tensor parallel: there Paddle 3.3's backward through the shared keys and values stops ("empty
    # GradSlotMeta" with the head whole; with it split, a reduce_scatter that has no CPU kernel).
    if share_prompts and (head is None or is_dist_tensor(head.weight)):
        warn_prompts_unshared()
        share_prompts = False
    if head is None:
        logits = response_logits(model, exp)
        stats = token_logprobs_and_entropy(logits, labels, temperature)
        if extra_ids is None:
            return stats
        label_logits = paddle.take_along_axis(logits, labels.unsqueeze(-1), axis=-1).squeeze(-1)
        extra_logits = paddle.take_along_axis(logits, extra_ids, axis=-1)
        return (*stats, logprobs_from_label(extra_logits, label_logits, stats[0], temperature))
    hidden = response_hidden(model, head, exp, share_prompts)
    transpose = getattr(head, "transpose_y", False)
    stats = head_token_stats(hidden, head.weight, transpose, labels, temperature, chunk_tokens)
    if extra_ids is None:
        return stats
    return (*stats, logprobs_at(hidden, head.weight, transpose, labels, stats[0], extra_ids, temperature))


def response_hidden(model, head, exp, share_prompts=False):
    """The hidden states that predict the response tokens [B, R, H] (`head`: the model's chunkable LM head)."""
    groups = shared_prompt_groups(exp) if share_prompts else None
    if groups is not None:
        return shared_prompt_hidden(model, head, exp, *groups)
    with lm_head_skipped(head, response_positions(exp)):
        return model_logits(model, exp)  # the head returns its input: hidden states


@paddle.no_grad()
def response_topk_logprobs(model, exp, k, temperature=1.0, chunk_tokens=DEFAULT_CHUNK_TOKENS, share_prompts=False):
    """(log-probs [B, R] of the response tokens, the k most likely tokens' log-probs and ids [B, R, k] at each
    response position) under `model`, chunk by chunk from its hidden states where its head allows (as
    response_token_stats), else from its whole response logits."""
    labels = response_labels(exp)
    head = chunkable_lm_head(model)
    if head is None:
        return topk_logprobs(response_logits(model, exp), labels, k, temperature)
    hidden = response_hidden(model, head, exp, share_prompts and not is_dist_tensor(head.weight))
    return head_topk_logprobs(hidden, head.weight, getattr(head, "transpose_y", False), labels, k, temperature, chunk_tokens)


@functools.lru_cache(maxsize=None)
def warn_prompts_unshared():
    logger.warning("share_prompt_forward: this model's LM head is not a plain one on this rank (adapters, fleet's "
                   "model-parallel layers, a tensor-parallel model, or sliced by sharding stage 3), so each row "
                   "runs its whole prompt")


def shared_prompt_hidden(model, head, exp, first, row_prompt):
    """The hidden states that predict the response tokens, [B, R, H], as model_logits gives them with the head
    skipped, where each distinct prompt (rows `first`; row b's is row_prompt[b]) runs through the model once: its
    keys and values are handed to the rows that share it, whose responses then run on them (the gradient
    through them sums over those rows). B rows of G distinct prompts compute G prompts instead of B: with 4
    samples of 256 prompt and 512 response tokens, a quarter of the tokens."""
    prompt_len, width = exp.prompt_len, exp.input_ids.shape[1]
    positions = position_ids_from_mask(exp.attention_mask)
    prompts = [paddle.index_select(x[:, :prompt_len], first, axis=0) for x in (exp.input_ids, exp.attention_mask, positions)]
    prepare_for_shared_prompts(model)
    with lm_head_skipped(head, slice(prompt_len - 1, prompt_len)):
        out = model(input_ids=prompts[0], attention_mask=prompts[1], position_ids=prompts[2], use_cache=True,
                    return_dict=True)
    last = paddle.index_select(out.logits, row_prompt, axis=0)  # predicts each row's first response token
    if width - prompt_len == 1:
        return last
    past = [tuple(paddle.index_select(t, row_prompt, axis=0) for t in layer) for layer in out.past_key_values]
    with lm_head_skipped(head, slice(None)):
        hidden = model(input_ids=exp.input_ids[:, prompt_len:-1], attention_mask=exp.attention_mask[:, :-1],
                       position_ids=positions[:, prompt_len:-1], past_key_values=past, use_cache=False,
                       return_dict=True).logits
    return paddle.concat([last, hidden], axis=1)
