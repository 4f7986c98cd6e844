"""The no-gradient forward of a paddlenlp Qwen2/Llama causal LM in one custom op per pass
(`native_decoder_forward`, csrc/decoder_ops.cc): the rollout's decode loop and the reference/old log-probs
need no autograd, and eager Paddle spends most of their time dispatching hundreds of small ops.

`NativeDecoder.for_model(model)` lists the model's weight tensors for the op (no copies: the op computes q, k
and v, and gate and up, as separate products into one output each), or returns None, saying once why,
where the op does not apply: the op is not built, PADDLE_ALIGNMENT_FUSED_KERNELS=off (Paddle's own ops, for
comparison) or PADDLE_ALIGNMENT_NATIVE_FORWARD=off (the eager passes with the fused kernels), or the model is not a
float32 CPU Qwen2/Llama on one device without LoRA adapters. Callers then run the model's own forward.

- `response_hidden(input_ids, attention_mask, prompt_len)`: the trainer's log-prob pass, positions counted
  over real tokens (`position_ids_from_mask`), the final hidden states of the positions that predict the
  response only, which the LM head (`lm_head`) projects a chunk of tokens at a time (models/head_logprobs.py);
- `NativeCacheSession`: the static-cache decode loop's forward (models/static_cache_decoder.py), positions
  i of the left-padded batch being i for every row, keys and values kept in one cache tensor; for multi-turn
  rollouts, positions counted over each row's real tokens, and each row's cache (`RowCache`) carried from one
  turn's session to the next (`continuing`).

Results equal paddlenlp's forward to 1e-5 (float32) on every position a caller reads. A query with no
visible key (a left-padding position) gets a zero attention output where paddlenlp averages over the
masked keys; nothing reads those positions.
"""

import copy
import logging
import math
import os
import types
import weakref
from functools import cached_property, lru_cache

import numpy as np
import paddle

from paddle_alignment.algos.token_stats import position_ids_from_mask
from paddle_alignment.custom_ops import paddlenlp_ops_with
from paddle_alignment.models.decoder_weights import LMHead, unsupported_reason
from paddle_alignment.models.fused_kernels import fused_ops
from paddle_alignment.models.lora_utils import is_lora

logger = logging.getLogger(__name__)

NATIVE_OPS = ("native_decoder_forward", "native_packed_products")
# The decode steps of a session with at most PACKED_MAX_ROWS rows (csrc/common/mkl_gemm.h's kSlicedMaxRows) and at
# least PACKED_MIN_STEPS new tokens to go run their large products on MKL's packed form of their weights
# (NativeDecoder.for_session): few-row products read packed weights near MKL's peak, and the steps repay the
# packing (bench_real_size.py --mode packing measures both; benchmarks/RESULTS.md). A model under
# PACKED_MIN_PARAMETERS is not packed: its weights stay in the cache, and packing a session costs more than its
# decode steps take.
PACKED_MAX_ROWS, PACKED_MIN_STEPS, PACKED_MIN_PARAMETERS = 64, 64, 1 << 24
SWITCH = "PADDLE_ALIGNMENT_NATIVE_FORWARD"


def native_ops():
    """The `paddlenlp_ops` module with the native decoder op, else None (said once); None too with
    PADDLE_ALIGNMENT_FUSED_KERNELS=off or PADDLE_ALIGNMENT_NATIVE_FORWARD=off (this op alone off)."""
    if fused_ops() is None or os.environ.get(SWITCH, "on").lower() == "off":
        return None
    return paddlenlp_ops_with(NATIVE_OPS, "no-gradient passes run on Paddle's ops")


@lru_cache(maxsize=None)
def warn_unsupported(reason):
    logger.warning(f"native forward unavailable ({reason}): the pass runs on Paddle's ops")


def native_unsupported_reason(model):
    """Why the native op cannot run `model`, or None when it can."""
    return op_weights(model)[1]


def op_weights(model):
    """(the tensors the op would read for `model`, None) when it can run it, else (None, why not)."""
    reason = structure_reason(model)
    if reason is None and model.training and getattr(model.config, "attention_dropout", 0.0) > 0:
        reason = "attention dropout in training mode"
    if reason is not None:
        return None, reason
    weights = NativeDecoder.weight_list(model)
    reason = weights_reason(weights)
    return (None, reason) if reason is not None else (weights, None)


STRUCTURE_REASONS = weakref.WeakKeyDictionary()  # model -> structure_reason(model): found once per model object


def structure_reason(model):
    """What in `model`'s class, config or layers the op does not compute, or None. These never change for a
    model object, and finding them walks every layer, so they are found once per model."""
    if model not in STRUCTURE_REASONS:
        STRUCTURE_REASONS[model] = find_structure_reason(model)
    return STRUCTURE_REASONS[model]


def find_structure_reason(model):
    if is_lora(model):
        return "LoRA-wrapped models run their adapters in their own forward"
    reason = unsupported_reason(model)
    if reason is not None:
        return reason
    config = model.config
    if getattr(config, "alibi", False) or not getattr(config, "rope", True):
        return "only rotary position embeddings are supported"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention is not supported"
    for layer in getattr(model, model.base_model_prefix).layers:
        linears = [layer.self_attn.o_proj, layer.mlp.down_proj]
        linears += [] if getattr(layer.mlp, "fuse_attention_ffn", False) else [layer.mlp.gate_proj, layer.mlp.up_proj]
        if any(linear.bias is not None for linear in linears):
            return "biases on o/gate/up/down projections are not supported"
    return None


def weights_reason(weights):
    """Why the op cannot read `weights` (the tensors it would be given), or None. Checked at every pass: a model
    may be split by the tensor-parallel plan, or moved to another device or precision, after its first pass."""
    if any(w.is_dist() for w in weights):
        return "tensor-parallel models"
    if any(w.dtype != paddle.float32 or not w.place.is_cpu_place() for w in weights):
        return "only float32 CPU weights are supported"
    return None


WEIGHT_SLOTS = weakref.WeakKeyDictionary()  # model -> weight_slots(model): found once per model object


def weight_slots(model):
    """Where each tensor the op reads lives, in the op's order (csrc/README.md): (a layer, its attribute), read at
    every pass, so that a parameter replaced or moved is seen. Like structure_reason, found once per model: the
    walk through every layer was most of a small model's `for_model`."""
    if model not in WEIGHT_SLOTS:
        base = getattr(model, model.base_model_prefix)
        with_bias = has_qkv_bias(base.layers[0].self_attn)  # the op's has_qkv_bias, which NativeDecoder passes
        slots = [slot for layer in base.layers for slot in layer_slots(layer, with_bias)]
        WEIGHT_SLOTS[model] = slots + [(base.embed_tokens, "weight"), (base.norm, "weight"), (model.lm_head, "weight")]
    return WEIGHT_SLOTS[model]


def layer_slots(layer, with_qkv_bias):
    """A decoder layer's slots in the op's order (q/k/v biases `with_qkv_bias`: zeros for a projection without one)."""
    attention, mlp = layer.self_attn, layer.mlp
    projections = [attention.q_proj, attention.k_proj, attention.v_proj]
    biases = [(proj, "bias") if proj.bias is not None else constant(paddle.zeros([proj.weight.shape[1]], "float32"))
              for proj in projections] if with_qkv_bias else []
    if getattr(mlp, "fuse_attention_ffn", False):  # [gate | up] columns in one weight: the op reads both halves
        gate_up = [(mlp.gate_up_fused_proj, "weight"), constant(paddle.empty([0], dtype="float32"))]
    else:
        gate_up = [(mlp.gate_proj, "weight"), (mlp.up_proj, "weight")]
    return [(layer.input_layernorm, "weight"), *((proj, "weight") for proj in projections), *biases,
            (attention.o_proj, "weight"), (layer.post_attention_layernorm, "weight"), *gate_up, (mlp.down_proj, "weight")]


def constant(tensor):
    """A slot that always holds `tensor`."""
    return types.SimpleNamespace(tensor=tensor), "tensor"


def has_qkv_bias(attention):
    """Whether the op takes q/k/v biases for this model (decided on its first layer, for all)."""
    return any(proj.bias is not None for proj in (attention.q_proj, attention.k_proj, attention.v_proj))


class NativeDecoder:
    """A model's own weight tensors in the op's order: listed, not copied, so making one costs nothing and it
    always computes with the model's current weights."""

    def __init__(self, model, ops, weights):
        self.ops, self.weights = ops, weights
        self.packed = False  # whether `weights` end with a session's packed products (for_session)
        base = getattr(model, model.base_model_prefix)
        attention = base.layers[0].self_attn
        self.has_qkv_bias = has_qkv_bias(attention)
        self.lm_head = LMHead(model.lm_head, group=None)
        self.transpose_lm_head = self.lm_head.transpose
        self.epsilon = float(base.norm.variance_epsilon)
        self.rotary_emb = attention.rotary_emb
        self.cache_shape = [len(base.layers), 2, None, attention.num_key_value_heads, None, attention.head_dim]

    @staticmethod
    def weight_list(model):
        """The tensors the op reads, in its order: the model's own, none copied."""
        return [getattr(owner, name) for owner, name in weight_slots(model)]

    @classmethod
    def for_model(cls, model):
        """The native forward of `model`, or None (with one warning saying why) where it does not apply."""
        ops = native_ops()
        if ops is None:
            return None
        weights, reason = op_weights(model)
        if reason is not None:
            warn_unsupported(reason)
            return None
        return cls(model, ops, weights)

    def for_session(self, rows, steps):
        """The decoder for the decode steps of `rows` rows, up to `steps` more: this one, or, for at most
        PACKED_MAX_ROWS rows and at least PACKED_MIN_STEPS steps on a model of at least PACKED_MIN_PARAMETERS
        parameters, one that also holds MKL's packed form of the weights of q, o, gate, up, down and the LM head
        (native_packed_products, csrc/README.md), made now, which the few-row products then read. A session keeps it
        to its end: 1.8 GiB of resident memory at Qwen2.5-0.5B's shape, where the weights take 1.8."""
        if (self.packed or rows > PACKED_MAX_ROWS or steps < PACKED_MIN_STEPS
                or self.parameters < PACKED_MIN_PARAMETERS):
            return self
        decoder = copy.copy(self)
        decoder.weights = self.weights + [self.ops.native_packed_products(self.weights, self.has_qkv_bias,
                                                                          self.transpose_lm_head)]
        decoder.packed = True
        return decoder

    @cached_property
    def parameters(self):
        """How many values the model's tensors hold (a session asks at every decode step: counted once)."""
        return sum(math.prod(w.shape) for w in (self.weights[:-1] if self.packed else self.weights))

    def rope_tables(self, length):
        """cos and sin of positions [0, length): [length, head_dim] float32 (the model's own tables)."""
        probe = paddle.empty([1], dtype="float32")
        cos, sin = self.rotary_emb(probe, seq_len=length)  # [1, at least length, 1, head_dim]
        return cos[0, :length, 0], sin[0, :length, 0]

    def new_cache(self, batch, length):
        """Keys and values of every layer: [layers, 2, batch, kv_heads, length, head_dim]."""
        layers, _, _, kv_heads, _, head_dim = self.cache_shape
        return paddle.empty([layers, 2, batch, kv_heads, length, head_dim], dtype="float32")

    def __call__(self, input_ids, position_ids, key_valid, cache, rope, start, logits_start, logits_end,
                 apply_lm_head=True):
        """Logits [B, logits_end - logits_start, V] of the new tokens `input_ids` [B, S] at cache positions
        [start, start + S), or with `apply_lm_head` False their final-normed hidden states [.., H]; see
        csrc/decoder_ops.cc."""
        return self.ops.native_decoder_forward(
            input_ids, position_ids, key_valid, cache, *rope, self.weights, start, self.epsilon, self.has_qkv_bias,
            self.transpose_lm_head, logits_start, logits_end, apply_lm_head,
        )

    def response_hidden(self, input_ids, attention_mask, prompt_len, groups=None):
        """The final-normed hidden states that predict each response token of left-padded prompts + responses:
        [B, R, H], for the LM head (`self.lm_head`) to project chunk by chunk (the trainer's
        `response_token_stats`, positions counted over real tokens). With `groups` (shared_prompts.prompt_groups:
        the first row of each distinct prompt, each row's among them) each prompt runs once, and its rows'
        responses continue from its keys and values."""
        batch, length = input_ids.shape
        input_ids, attention_mask = input_ids.astype("int64"), attention_mask.astype("int64")
        positions, rope = position_ids_from_mask(attention_mask), self.rope_tables(length)
        if groups is None:
            return self(input_ids, positions, attention_mask, self.new_cache(batch, length), rope, 0, prompt_len - 1,
                        length - 1, False)
        first, row_prompt = groups
        prompts = [paddle.index_select(x, first, axis=0) for x in (input_ids[:, :prompt_len], positions[:, :prompt_len], attention_mask)]
        cache = self.new_cache(len(first), length)
        last = paddle.index_select(self(*prompts, cache, rope, 0, prompt_len - 1, prompt_len, False), row_prompt, axis=0)
        if length - prompt_len == 1:
            return last
        rest = self(input_ids[:, prompt_len:-1], positions[:, prompt_len:-1], attention_mask,
                    paddle.index_select(cache, row_prompt, axis=2), rope, prompt_len, 0, length - prompt_len - 1, False)
        return paddle.concat([last, rest], axis=1)


class NativeCacheSession:
    """The static-cache decode loop's forward on the native op: forward(input_ids [B, L]) -> logits of the
    last position [B, V], appending to one cache of `max_len` slots, prompt padding masked. Position i of the
    left-padded batch is i for every row; with `real_positions` (a session whose rows' caches carry over to
    later turns, `continuing` and `row_caches`), positions count each row's real tokens, as the trainer's
    forward counts them (`position_ids_from_mask`), so that a row's cache does not depend on its padding."""

    def __init__(self, decoder, batch_size, max_len, prompt_mask, real_positions=False, cache=None):
        new_tokens = max_len - prompt_mask.shape[1]
        self.decoder, self.batch_size = decoder, batch_size
        self.cache = decoder.new_cache(batch_size, max_len) if cache is None else cache
        generated = paddle.ones([batch_size, new_tokens], dtype="int64")
        self.key_valid = paddle.concat([prompt_mask.astype("int64"), generated], axis=1)
        self.rope = decoder.rope_tables(max_len)
        self.position = 0  # the next cache slot
        # The position of slot `self.position` in each row (a left-padding slot's may be negative: it is clipped).
        padding = prompt_mask.shape[1] - prompt_mask.astype("int64").sum(axis=1)
        self.row_position = -padding if real_positions else paddle.zeros([batch_size], dtype="int64")

    @classmethod
    def continuing(cls, decoder, caches, block_mask, max_dec):
        """A session whose row r holds the cached keys and values of `caches[r]` (RowCache: its trajectory's first
        tokens, in the slots its last turn left them, gaps masked) and continues with a left-padded block of
        `block_mask` [B, L] next tokens, then up to `max_dec` generated ones. Each cache group's slots are
        right-aligned before the block: contiguous copies, no gather of single tokens."""
        history, (batch, block) = max(c.slots.shape[4] for c in caches), block_mask.shape
        parts, order, masks = [], [], []
        for group in {id(c.slots): c.slots for c in caches}.values():  # the caches taken together, kept together
            members = [(row, c) for row, c in enumerate(caches) if c.slots is group]
            rows = paddle.index_select(group, paddle.to_tensor([c.index for _, c in members], dtype="int64"), axis=2)
            parts.append(left_padded(rows, history))
            order += [row for row, _ in members]
            masks += [np.pad(c.valid, (history - len(c.valid), 0)) for _, c in members]
        past = paddle.concat(parts, axis=2)
        inverse = np.argsort(order)
        past = paddle.index_select(past, paddle.to_tensor(inverse, dtype="int64"), axis=2)
        past_mask = paddle.to_tensor(np.stack(masks)[inverse], dtype="int64")
        layers, _, _, kv_heads, _, head_dim = decoder.cache_shape
        free = paddle.empty([layers, 2, batch, kv_heads, block + max_dec, head_dim], dtype="float32")
        session = cls(decoder, batch, history + block + max_dec, paddle.concat([past_mask, block_mask.astype("int64")], axis=1),
                      cache=paddle.concat([past, free], axis=4))
        session.position = history
        lengths = paddle.to_tensor([cache.length for cache in caches], dtype="int64")
        session.row_position = lengths - (block - block_mask.astype("int64").sum(axis=1))
        return session

    def forward(self, input_ids):
        start, length = self.position, input_ids.shape[1]
        if length == 1:  # a decode step: decided on the rows it runs (repeated, or fewer once finished ones leave)
            self.decoder = self.decoder.for_session(self.batch_size, self.key_valid.shape[1] - start)
        positions = (self.row_position.unsqueeze(1) + paddle.arange(length, dtype="int64")).clip(min=0)
        logits = self.decoder(input_ids.astype("int64"), positions, self.key_valid, self.cache, self.rope, start,
                              length - 1, length)
        self.position = start + length
        self.row_position = self.row_position + length
        return logits.reshape([self.batch_size, -1])

    def row_caches(self, rows, counts):
        """The RowCaches of rows `rows` (their positions in the batch) holding their first `counts` real tokens
        (at most those fed so far): the rows' slots up to now, taken together in one copy, with each row's mask
        of the slots that hold its tokens."""
        valid = self.key_valid[:, : self.position].numpy()
        slots = paddle.index_select(self.cache, paddle.to_tensor(rows, dtype="int64"), axis=2)[:, :, :, :, : self.position]
        caches = []
        for index, (row, count) in enumerate(zip(rows, counts)):
            mask = valid[row] * (np.cumsum(valid[row]) <= count)  # slots fed after its last real token are garbage
            caches.append(RowCache(slots, index, mask, count))
        return caches

    def repeat_rows(self, copies):
        """See StaticCacheDecoder.repeat_rows."""
        self.cache = paddle.repeat_interleave(self.cache, copies, axis=2)
        self.key_valid = paddle.repeat_interleave(self.key_valid, copies, axis=0)
        self.row_position = paddle.repeat_interleave(self.row_position, copies, axis=0)
        self.batch_size *= copies

    def keep_rows(self, kept):
        """See StaticCacheDecoder.keep_rows."""
        self.cache = paddle.index_select(self.cache, kept, axis=2)
        self.key_valid = paddle.index_select(self.key_valid, kept)
        self.row_position = paddle.index_select(self.row_position, kept)
        self.batch_size = kept.shape[0]


class RowCache:
    """A trajectory's first `length` tokens' keys and values, at positions 0 .. length - 1: row `index` of
    `slots` [layers, 2, rows, kv_heads, S, head_dim] (shared by the rows taken together), `valid` [S] marking the
    slots that hold them. What a later turn of the trajectory continues from instead of prefilling them."""

    def __init__(self, slots, index, valid, length):
        self.slots, self.index, self.valid, self.length = slots, index, valid, length


def left_padded(cache, length):
    """`cache` [layers, 2, rows, kv_heads, S, head_dim] with length - S empty slots before its S."""
    missing = length - cache.shape[4]
    if missing == 0:
        return cache
    shape = list(cache.shape)
    shape[4] = missing
    return paddle.concat([paddle.zeros(shape, dtype=cache.dtype), cache], axis=4)
