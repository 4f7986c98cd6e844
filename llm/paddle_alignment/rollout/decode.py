"""The decode loop: sample `n` responses per prompt and package them as an `Experience`.

Two decoders give the same output contract:
- the fast path: a decode loop over a preallocated KV cache (models/static_cache_decoder.py) whose
  sampling side runs on the `paddlenlp_ops` custom ops built from csrc/ (penalties, top-k/top-p
  sampling, history and stop bookkeeping), with one host synchronisation per step (the stop check);
- paddlenlp's `generate()` (with an explicit attention mask, which CPU needs), used when the ops are
  not installed, `use_fusemt` is off, or the model is not supported by the fast path.
"""

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import paddle

from paddle_alignment.custom_ops import paddlenlp_ops_with
from paddle_alignment.experience import Experience
from paddle_alignment.group_sharded import forwards_in_lockstep
from paddle_alignment.models.decoder_weights import unsupported_reason
from paddle_alignment.models.fused_kernels import token_logprobs_and_entropy
from paddle_alignment.models.static_cache_decoder import StaticCacheDecoder
from paddle_alignment.tokens import decode_responses, end_ids, left_pad, through_first_end

logger = logging.getLogger(__name__)

ROLLOUT_OPS = ("rollout_token_penalty", "rollout_sample", "rollout_save_step", "rollout_update_stop")


@dataclass(frozen=True)
class SamplingConfig:
    max_dec_len: int
    min_dec_len: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    greedy: bool = False

    def penalizes(self, step):
        """Whether rollout_token_penalty can change step `step`'s logits: a repetition penalty, or the end token
        still masked before `min_dec_len` (every running row is at that step). Else it leaves them untouched."""
        return self.repetition_penalty != 1.0 or step < self.min_dec_len

    @classmethod
    def from_args(cls, args, greedy=False):
        return cls(
            args.max_dec_len, args.min_dec_len, args.temperature, args.top_p, args.repetition_penalty, args.top_k, greedy
        )


def rollout_ops():
    """The `paddlenlp_ops` module when it provides this project's rollout ops, else None (said once)."""
    return paddlenlp_ops_with(ROLLOUT_OPS, "rollout uses generate(), not the fast decode loop")


@lru_cache(maxsize=None)
def warn_unsupported(reason):
    logger.warning(f"fast rollout unavailable ({reason}): rollout uses generate()")


def fast_path_ops(model, use_fast):
    """The rollout ops when the fast decode loop can run `model`, else None."""
    if not use_fast:
        return None
    ops = rollout_ops()
    reason = unsupported_reason(model)
    if ops is not None and reason is not None:
        warn_unsupported(reason)
        return None
    return ops


def response_mask_from_tokens(response_ids, end_token_ids):
    """Mask [B, R] of tokens up to and including the first end id (`end_token_ids`: one id or a list), and whether
    each row reached one."""
    is_eos = paddle.isin(response_ids, paddle.to_tensor(end_token_ids, dtype=response_ids.dtype).reshape([-1])).astype("int64")
    eos_seen_before = paddle.cumsum(is_eos, axis=1) - is_eos
    mask = (eos_seen_before == 0).astype("float32")
    return mask, is_eos.sum(axis=1) > 0


def per_row(value, rows, dtype):
    return paddle.full([rows], value, dtype=dtype)


def draw_seed():
    """A sampling seed from paddle's generator: reproducible with the run's seed and restored on resume."""
    return int(paddle.randint(0, 2**31 - 1, [1]))


class RunningRows:
    """The per-row state of the rows still decoding (history, step counts, stop flags, sampling settings), and
    `row_ids`, their indices in the whole batch: finished rows are dropped from the batch (`drop_finished`)
    so that no step computes, samples or attends for them."""

    PER_ROW = ("row_ids", "history", "step_idx", "stop_flags", "repetition", "frequency", "presence", "min_len",
               "temperature", "top_k", "top_p")

    def __init__(self, rows, sampling: SamplingConfig, pad_id):
        self.row_ids = paddle.arange(rows, dtype="int64")
        self.history = paddle.full([rows, sampling.max_dec_len], pad_id, dtype="int64")
        self.step_idx = paddle.zeros([rows], dtype="int64")
        self.stop_flags = paddle.zeros([rows], dtype="bool")
        self.repetition = per_row(sampling.repetition_penalty, rows, "float32")
        self.frequency, self.presence = per_row(0.0, rows, "float32"), per_row(0.0, rows, "float32")
        self.min_len = per_row(sampling.min_dec_len, rows, "int64")
        self.temperature = per_row(0.0 if sampling.greedy else sampling.temperature, rows, "float32")
        self.top_k, self.top_p = per_row(sampling.top_k, rows, "int64"), per_row(sampling.top_p, rows, "float32")

    def __len__(self):
        return self.row_ids.shape[0]

    @property
    def penalties(self):
        return self.repetition, self.frequency, self.presence, self.min_len

    def finished_enough(self):
        """Whether a quarter of the rows have finished: dropping them then saves more than the copy of the
        KV cache that it costs."""
        return 4 * int(self.stop_flags.astype("int32").sum()) >= len(self)

    def drop_finished(self, responses):
        """Write the finished rows' tokens into `responses` [all rows, max_dec_len] and keep the others; returns
        the positions kept (for the decoder's cache and the last tokens)."""
        finished = paddle.nonzero(self.stop_flags).reshape([-1])
        kept = paddle.nonzero(paddle.logical_not(self.stop_flags)).reshape([-1])
        paddle.scatter_(responses, self.row_ids[finished], self.history[finished], overwrite=True)
        for name in self.PER_ROW:
            setattr(self, name, paddle.index_select(getattr(self, name), kept))
        return kept


def decode_with_ops(ops, model, tokenizer, input_ids, prompt_mask, sampling: SamplingConfig, seed, copies=1, past=None,
                    carry=False):
    """The fast decode loop, sampling from `seed` `copies` responses of each prompt of `input_ids` [P, L]
    (rows B = P * copies, a prompt's copies adjacent; the prompt is prefilled once and its cache repeated):
    returns response ids [B, R], R = the longest response, and their log-probs under the sampling policy
    softmax(logits / temperature), taken from the logits before penalties (None when decoding greedily).
    Rows that finish are dropped from the batch once a quarter of it has finished, and the loop stops when
    every row has; each row samples what it would in the whole batch (its random stream is keyed by its row).

    With `carry` (multi-turn trajectories, copies 1) it also returns each row's RowCache: the keys and values
    of its prompt and its sampled tokens but the last (which the next turn feeds); with `past` (a RowCache
    per row) the rows continue from those caches, `input_ids` holding only the tokens after them."""
    prompts, prompt_len = input_ids.shape
    rows, max_dec = prompts * copies, sampling.max_dec_len
    if past is not None:
        decoder = StaticCacheDecoder.continuing(model, past, prompt_mask, max_dec)
    else:
        decoder = StaticCacheDecoder(model, prompts, prompt_len + max_dec, prompt_mask, carry=carry)
    cached = CachedRows(decoder, prompt_mask, past, end_ids(tokenizer)) if carry else None
    eos_ids = paddle.to_tensor(end_ids(tokenizer), dtype="int64")
    no_banned = paddle.zeros([0], dtype="int64")
    running = RunningRows(rows, sampling, tokenizer.pad_token_id)
    responses = paddle.full([rows, max_dec], tokenizer.pad_token_id, dtype="int64")
    record_logprobs = not sampling.greedy
    logprobs = paddle.zeros([rows, max_dec], dtype="float32") if record_logprobs else None
    seed = decoder.same_on_every_rank(seed)
    logits = decoder.prefill(input_ids)
    if copies > 1:
        decoder.repeat_rows(copies)
        logits = paddle.repeat_interleave(logits, copies, axis=0)
    length = 0  # of the longest response: every running row has taken each step so far
    for step in range(max_dec):
        policy_logits = logits
        if sampling.penalizes(step):  # the op changes the logits in place: the policy's are kept for the log-probs
            policy_logits = logits.clone() if record_logprobs else None
            ops.rollout_token_penalty(logits, running.history, running.step_idx, *running.penalties, eos_ids, no_banned)
        tokens = ops.rollout_sample(logits, running.temperature, running.top_k, running.top_p, running.step_idx,
                                    running.row_ids, seed)
        refuse_unsampled(tokens, running, step)
        if record_logprobs:
            token_logprobs = token_logprobs_and_entropy(policy_logits, tokens.reshape([-1]), sampling.temperature)[0]
            logprobs[running.row_ids, step] = token_logprobs
        ops.rollout_save_step(running.history, running.step_idx, tokens, running.stop_flags)
        _, _, not_need_stop = ops.rollout_update_stop(tokens, running.stop_flags, running.step_idx, eos_ids, max_dec,
                                                      tokenizer.pad_token_id)
        length = step + 1
        if not bool(not_need_stop):
            break
        if running.finished_enough():
            if cached is not None:
                cached.keep(running, running.stop_flags)
            kept = running.drop_finished(responses)
            decoder.keep_rows(kept)
            tokens = paddle.index_select(tokens, kept)
        logits = decoder.step(tokens)
    paddle.scatter_(responses, running.row_ids, running.history, overwrite=True)
    if cached is not None:
        cached.keep(running, paddle.ones_like(running.stop_flags))
    return responses[:, :length], logprobs[:, :length] if record_logprobs else None, cached and cached.caches


def refuse_unsampled(tokens, running, step):
    """Raise where rollout_sample found nothing to sample from (its token -1: csrc/README.md), naming the rows:
    decoding on would feed an invalid token id to the next step, or hide a policy that diverged."""
    unsampled = tokens.numpy().reshape(-1) < 0  # NumPy's test: paddle's own `any` dispatches several ops per step
    if not unsampled.any():
        return
    rows = running.row_ids.numpy()[unsampled].tolist()
    raise FloatingPointError(
        f"decode step {step}: nothing to sample from for row(s) {rows} of the rollout batch: their logits hold NaN "
        "or +inf, or are -inf everywhere. The policy's forward diverged or overflowed: lower the learning rate, "
        "clip gradients (max_grad_norm), or, in float16/bfloat16, run in float32 to find where."
    )


class CachedRows:
    """The RowCache of each row of a carrying decode, taken from the decoder when the row leaves the batch."""

    def __init__(self, decoder, prompt_mask, past, ends):
        self.decoder, self.ends = decoder, ends
        self.prefix = prompt_mask.astype("int64").sum(axis=1).numpy() + (0 if past is None else [c.length for c in past])
        self.caches = [None] * prompt_mask.shape[0]

    def keep(self, running, leaving):
        """Take the caches of the rows of `running` (RunningRows) where `leaving`: the prefix and the sampled
        tokens up to the first end id but the last (which was never fed)."""
        positions = np.flatnonzero(leaving.numpy())
        history, row_ids, steps = running.history.numpy(), running.row_ids.numpy(), running.step_idx.numpy()
        counts = []
        for position in positions:
            sampled = through_first_end(history[position, : steps[position]].tolist(), self.ends)
            counts.append(int(self.prefix[row_ids[position]]) + sampled - 1)
        for position, cache in zip(positions, self.decoder.row_caches(positions.tolist(), counts)):
            self.caches[row_ids[position]] = cache


def decode_with_generate(model, tokenizer, input_ids, prompt_mask, sampling: SamplingConfig):
    response_ids, _ = model.generate(
        input_ids=input_ids,
        attention_mask=prompt_mask,
        decode_strategy="greedy_search" if sampling.greedy else "sampling",
        max_new_tokens=sampling.max_dec_len,
        min_new_tokens=sampling.min_dec_len,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        repetition_penalty=sampling.repetition_penalty,
        top_k=sampling.top_k,
        # paddlenlp's min-length processor takes one end id: a row that ends at another decodes on, masked after
        # it (package_rollouts).
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
        synced_gpus=forwards_in_lockstep(model),  # a rank done early goes on with forwards while others decode
    )
    return response_ids


@paddle.no_grad()
def sample_continuations(model, tokenizer, prompt_ids, prompt_mask, n, sampling: SamplingConfig, use_fast=True, seed=None):
    """`n` sampled continuations of each left-padded row of `prompt_ids` [P, L] (rows B = P * n, a row's copies
    adjacent): (response ids [B, R], the log-prob each token was drawn with [B, R] or None). The fast loop
    samples from `seed` (default: one drawn from paddle's generator) and records the log-probs (not when
    greedy); generate() samples from paddle's generator and records none."""
    ops = fast_path_ops(model, use_fast)
    logprobs = None
    with eval_mode(model):
        if ops is not None:
            response_ids, logprobs, _ = decode_with_ops(
                ops, model, tokenizer, prompt_ids, prompt_mask, sampling, draw_seed() if seed is None else seed, copies=n,
            )
        else:
            input_ids, row_mask = (paddle.repeat_interleave(t, n, axis=0) for t in (prompt_ids, prompt_mask))
            response_ids = decode_with_generate(model, tokenizer, input_ids, row_mask, sampling)
    return response_ids, logprobs


@contextmanager
def eval_mode(model):
    """`model` in eval mode inside, back in training mode after if it was."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        if was_training:  # (LoRAModel.train takes no mode argument)
            model.train()


@paddle.no_grad()
def sample_turn(model, tokenizer, histories, caches, sampling: SamplingConfig, use_fast=True, seed=None):
    """One sampled turn of each multi-turn trajectory of `histories` (token lists: the prompt and the turns and
    observations so far): (response ids [B, R], their log-probs or None, the RowCache of each row after the turn
    or None). Where the fast loop runs on the native forward the KV cache carries: with `caches` (each row's
    RowCache of its history's first tokens, from the previous turn) only the rest of each history is prefilled,
    at the positions a fresh forward over the whole trajectory gives them. Elsewhere every turn prefills the
    whole history (sample_continuations)."""
    if fast_path_ops(model, use_fast) is None or not StaticCacheDecoder.carries_cache(model):
        prompt_ids, prompt_mask = left_pad(histories, tokenizer.pad_token_id)
        return (*sample_continuations(model, tokenizer, prompt_ids, prompt_mask, 1, sampling, use_fast, seed), None)
    past = caches if caches is not None and all(cache is not None for cache in caches) else None
    block = histories if past is None else [history[cache.length :] for history, cache in zip(histories, past)]
    input_ids, mask = left_pad(block, tokenizer.pad_token_id)
    with eval_mode(model):
        return decode_with_ops(rollout_ops(), model, tokenizer, input_ids, mask, sampling,
                               draw_seed() if seed is None else seed, past=past, carry=True)


def generate_rollouts(model, tokenizer, items, n, sampling: SamplingConfig, use_fast=True, seed=None):
    """Sample `n` responses for each prompt item ({"prompt", "label", "input_ids"}) in one batched decode
    (sample_continuations), the log-prob each response token was drawn with as exp.rollout_logprobs when the
    fast loop recorded them."""
    prompt_ids, prompt_mask = left_pad([item["input_ids"] for item in items], tokenizer.pad_token_id)
    response_ids, logprobs = sample_continuations(model, tokenizer, prompt_ids, prompt_mask, n, sampling, use_fast, seed)
    input_ids, row_mask = (paddle.repeat_interleave(t, n, axis=0) for t in (prompt_ids, prompt_mask))
    exp = package_rollouts(tokenizer, items, n, input_ids, row_mask, response_ids)
    if logprobs is not None:
        exp.rollout_logprobs = logprobs * exp.response_mask
    return exp


def greedy_responses(model, tokenizer, items, max_new_tokens, use_fast=True):
    """The greedy response of each prompt item, at most `max_new_tokens` tokens: how a local LLM judge answers."""
    return generate_rollouts(model, tokenizer, items, 1, SamplingConfig(max_dec_len=max_new_tokens, greedy=True), use_fast).responses


def package_rollouts(tokenizer, items, n, input_ids, prompt_mask, response_ids):
    """The `Experience` of `n` responses per item: left-padded prompts `input_ids` [B, P] with `prompt_mask`,
    and the sampled `response_ids` [B, R] (anything after a row's first EOS is ignored)."""
    response_mask, finished = response_mask_from_tokens(response_ids, end_ids(tokenizer))
    # Padding after EOS becomes pad tokens, so decoding never shows what the model emitted past the end.
    response_ids = paddle.where(response_mask > 0, response_ids, paddle.full_like(response_ids, tokenizer.pad_token_id))
    responses = decode_responses(tokenizer, response_ids.numpy().tolist())
    return Experience(
        input_ids=paddle.concat([input_ids, response_ids], axis=1),
        attention_mask=paddle.concat([prompt_mask, response_mask.astype("int64")], axis=1),
        response_mask=response_mask,
        group_index=paddle.arange(len(items), dtype="int64").repeat_interleave(n),
        finished=finished,
        prompts=[item["prompt"] for item in items for _ in range(n)],
        labels=[item["label"] for item in items for _ in range(n)],
        responses=responses,
    )
