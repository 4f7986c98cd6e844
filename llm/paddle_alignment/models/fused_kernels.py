"""Fused CPU kernels for the model's elementwise work, from the `paddlenlp_ops` package (csrc/fused_ops.cc).

Paddle's CPU elementwise kernels are slow (RMSNorm's `pow` alone takes over a millisecond for the demo's
115k floats), so this module offers one fused op per hot spot, each with its gradient and equal to
Paddle's unfused ops to 1e-5 in float32:

- `rms_norm(x, weight, eps)`: paddlenlp's Qwen2/Llama RMSNorm;
- `swiglu(gate, up)`: silu(gate) * up, the MLP activation;
- `rotary(q, k, cos, sin, position_ids)`: paddlenlp's `apply_rotary_pos_emb` (rotate_half convention);
- `add_rms_norm(x, residual, weight, eps)`: the residual add and the norm after it, both results;
- `token_logprobs_and_entropy(logits, labels, temperature)`: log p(label) and the entropy of
  softmax(logits / temperature) in one op (the trainer's log-prob path);
- `fused_attention` (csrc/attention_ops.cc): the attention layers' core, softmax(q k^T / sqrt(d) + mask) v,
  with grouped-query heads read in place (paddlenlp repeats k and v in memory, and its gradient sums them
  back: most of a small layer's time, forward and backward).

Each falls back to Paddle's own ops where the fused op does not apply (ops not built, not a float32 CPU
tensor, a distributed tensor), so callers need no checks of their own.

`use_fused_kernels(model)` puts the first three and the attention into a paddlenlp Qwen2/Llama model's layers,
per instance (the RMSNorms' and MLPs' `forward`; the attention layers' rotary step, repeat_kv and `attn_func`),
and `use_unfused_kernels(model)` takes them out again. Patched models train under recompute. The fast decode
loop (models/static_cache_decoder.py) keeps its own norm/rope/MLP code, which the patch does not reach; it
can call `rms_norm`, `rotary` and `swiglu` directly. The residual add is not fused into the layers (that
would mean replacing paddlenlp's decoder-layer forward for one small op per layer); `add_rms_norm` is there
for code that owns its layer loop.
"""

import contextvars
import math
import os
import types

import paddle
import paddle.nn.functional as F
from paddle.distributed.auto_parallel.api import dtensor_from_local
from paddlenlp.transformers.llama import modeling as llama_modeling
from paddlenlp.transformers.qwen2 import modeling as qwen2_modeling

from paddle_alignment.algos.token_stats import entropy_from_logits, gather_logprobs, tempered_logits
from paddle_alignment.custom_ops import paddlenlp_ops_with
from paddle_alignment.models.tensor_parallel import is_dist_tensor, local_value

SWITCH = "PADDLE_ALIGNMENT_FUSED_KERNELS"
FUSED_OPS = ("fused_rms_norm", "fused_add_rms_norm", "fused_swiglu", "fused_rotary", "fused_token_logprobs")
# Apart from the rest: its products need Paddle's MKL (custom_ops.MKL_OPS), the elementwise ops do not.
ATTENTION_OPS = ("fused_attention",)

RMS_NORMS = (qwen2_modeling.Qwen2RMSNorm, llama_modeling.LlamaRMSNorm)
MLPS = (qwen2_modeling.Qwen2MLP, llama_modeling.LlamaMLP)
ATTENTIONS = (qwen2_modeling.Qwen2Attention, llama_modeling.LlamaAttention)
# The modules whose attention layers look up `apply_rotary_pos_emb` and `repeat_kv` by name at call time.
ATTENTION_MODULES = (qwen2_modeling, llama_modeling)

PATCHED = "_fused_kernels_patched"


def fused_ops(names=FUSED_OPS, instead="the model runs Paddle's unfused ops"):
    """The `paddlenlp_ops` module when it provides the fused ops `names` (said once when not, with what runs
    `instead`), else None; None too with PADDLE_ALIGNMENT_FUSED_KERNELS=off in the environment (Paddle's own
    ops, for comparison or debugging)."""
    if os.environ.get(SWITCH, "on").lower() == "off":
        return None
    return paddlenlp_ops_with(names, instead)


def attention_ops():
    """The `paddlenlp_ops` module when it provides the fused attention op and Paddle has the MKL it computes with,
    else None (said once): paddlenlp's own attention runs."""
    return fused_ops(ATTENTION_OPS, "attention runs paddlenlp's scaled_dot_product_attention")


def fusable(*tensors):
    """Whether the fused CPU kernels can take these tensors: dense float32 tensors on the CPU."""
    for t in tensors:
        if t.dtype != paddle.float32 or not t.place.is_cpu_place():
            return False
        if is_dist_tensor(t):
            return False
    return True


# ---- the ops, with their unfused fallbacks ---------------------------------------------------------


def rms_norm_reference(x, weight, epsilon):
    """paddlenlp's Qwen2/Llama RMSNorm (float32 statistics), as Paddle ops."""
    variance = paddle.square(x.astype("float32")).mean(-1, keepdim=True)
    hidden = paddle.rsqrt(variance + epsilon) * x
    if weight.dtype in (paddle.float16, paddle.bfloat16):
        hidden = hidden.astype(weight.dtype)
    return hidden * weight


def rms_norm(x, weight, epsilon):
    """x * rsqrt(mean(x^2, -1) + epsilon) * weight over the last axis."""
    ops = fused_ops()
    if ops is not None and fusable(x, weight):
        return ops.fused_rms_norm(x, weight, float(epsilon))[0]
    return rms_norm_reference(x, weight, epsilon)


def add_rms_norm(x, residual, weight, epsilon):
    """(rms_norm(x + residual), x + residual): a decoder layer's residual add and the norm after it."""
    ops = fused_ops()
    if ops is not None and fusable(x, residual, weight) and x.shape == residual.shape:
        out, total, _ = ops.fused_add_rms_norm(x, residual, weight, float(epsilon))
        return out, total
    total = x + residual
    return rms_norm_reference(total, weight, epsilon), total


def swiglu(gate, up):
    """silu(gate) * up."""
    ops = fused_ops()
    if ops is not None and fusable(gate, up) and gate.shape == up.shape:
        return ops.fused_swiglu(gate, up)
    return F.silu(gate) * up


def rotate_half(x):
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def rotary_reference(q, k, cos, sin, position_ids):
    """paddlenlp's Qwen2/Llama `apply_rotary_pos_emb`, as Paddle ops."""
    if position_ids is None:
        cos, sin = cos[:, : q.shape[1]], sin[:, : q.shape[1]]
    else:
        cos = cos.squeeze(axis=[0, 2])[position_ids].unsqueeze(2)
        sin = sin.squeeze(axis=[0, 2])[position_ids].unsqueeze(2)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_fusable(q, k, cos, sin, position_ids):
    """Whether the fused rotary op takes these: float32 CPU q [B, S, Hq, D] and k [B, S, Hk, D], cos and sin
    tables [1, L, 1, D], position ids [B, S]."""
    return (
        position_ids is not None
        and fusable(q, k, cos, sin)
        and len(q.shape) == 4
        and len(k.shape) == 4
        and list(cos.shape) == list(sin.shape)
        and len(cos.shape) == 4
        and cos.shape[0] == 1
        and cos.shape[2] == 1
        and cos.shape[3] == q.shape[3]
        and list(position_ids.shape) == list(q.shape[:2])
    )


def rotary(q, k, cos, sin, position_ids):
    """paddlenlp's `apply_rotary_pos_emb`: q [B, S, Hq, D] and k [B, S, Hk, D] rotated by the rows
    `position_ids` [B, S] of the [1, L, 1, D] cos/sin tables (rotate_half convention)."""
    ops = fused_ops()
    if ops is not None and rotary_fusable(q, k, cos, sin, position_ids):
        return tuple(ops.fused_rotary(q, k, cos, sin, position_ids.astype("int64")))
    return rotary_reference(q, k, cos, sin, position_ids)


def token_logprobs_and_entropy(logits, labels, temperature=1.0):
    """log p(labels) and the entropy of softmax(logits / temperature) per position, float32:
    logits [..., V], labels [...] -> ([...], [...]). The trainer's `gather_logprobs(tempered_logits(...))`
    and `entropy_from_logits(...)` in one op (two passes over the logits forward, one backward), gradients of
    both included (an output that is not differentiated costs nothing in the backward). Labels -100 (the
    ignore index of F.cross_entropy) give log-prob 0."""
    ops = fused_ops()
    if ops is not None and logits.place.is_cpu_place():
        if not is_dist_tensor(logits):
            return fused_token_stats(ops, logits, labels, temperature)
        if not paddle.is_grad_enabled() and all(placement.is_replicated() for placement in logits.placements):
            # A split model's whole logits (its vocabulary unsplit), without a backward: each rank's copy is
            # the whole value, and Paddle's CPU log_softmax over a real vocabulary takes minutes.
            stats = fused_token_stats(ops, logits._local_value(), local_value(labels), temperature)
            return tuple(dtensor_from_local(stat, logits.process_mesh, logits.placements) for stat in stats)
    tempered = tempered_logits(logits, temperature)
    return gather_logprobs(tempered, labels), entropy_from_logits(tempered)


def fused_token_stats(ops, logits, labels, temperature):
    if logits.dtype != paddle.float32:
        logits = logits.astype("float32")
    if labels.dtype != paddle.int64:
        labels = labels.astype("int64")
    logprobs, entropy, _ = ops.fused_token_logprobs(logits, labels, float(temperature))
    return logprobs, entropy


# ---- putting them into paddlenlp's layers -----------------------------------------------------------

# The patched attention layer that is running, if any: its rotary step takes the fused op, and its repeat_kv
# leaves grouped k and v heads unrepeated for its FusedAttention to read in place.
_PATCHED_ATTENTION = contextvars.ContextVar("patched_attention", default=None)
UNFUSED_ROTARY = {}  # module -> its own apply_rotary_pos_emb
UNFUSED_REPEAT_KV = {}  # module -> its own repeat_kv


def _rotary_dispatch(original):
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
        if _PATCHED_ATTENTION.get() is not None and rotary_fusable(q, k, cos, sin, position_ids):
            ops = fused_ops()
            if ops is not None:
                return tuple(ops.fused_rotary(q, k, cos, sin, position_ids.astype("int64")))
        return original(q, k, cos, sin, position_ids)

    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _defers_repeat_kv(layer):
    # paddlenlp's attention layers repeat k and v unless flash attention is configured (it reads grouped heads).
    return isinstance(layer.attn_func, FusedAttention) and not layer.config.use_flash_attention


def _repeat_kv_dispatch(original):
    def repeat_kv(hidden_states, n_rep):
        layer = _PATCHED_ATTENTION.get()
        if layer is not None and _defers_repeat_kv(layer):
            return hidden_states
        return original(hidden_states, n_rep)

    repeat_kv.__wrapped__ = original
    return repeat_kv


def _install_dispatchers():
    """Route paddlenlp's `apply_rotary_pos_emb` and `repeat_kv` (looked up by name when an attention layer
    runs) through dispatchers that change what they do only inside a patched attention layer and call the
    originals everywhere else, so unpatched models are unaffected. Installed once, at the first patch."""
    for module in ATTENTION_MODULES:
        if module not in UNFUSED_ROTARY:
            UNFUSED_ROTARY[module] = module.apply_rotary_pos_emb
            module.apply_rotary_pos_emb = _rotary_dispatch(module.apply_rotary_pos_emb)
            UNFUSED_REPEAT_KV[module] = module.repeat_kv
            module.repeat_kv = _repeat_kv_dispatch(module.repeat_kv)


def attention_fusable(query, key, value, attention_mask, output_attentions, config, args, kwargs):
    """Whether the fused attention op computes what paddlenlp's `scaled_dot_product_attention` would with these
    arguments: float32 CPU tensors, the additive float mask paddlenlp's models build (it is None only where
    the model is told the mask is causal by other means), no attention probabilities returned, no attention
    dropout (Qwen2 applies it in training), and none of the extras for other setups (Llama's alibi, start/end
    row indices, sequence or context parallel)."""
    extras = [*args, kwargs.get("attn_mask_startend_row_indices"), kwargs.get("reshard_layer")]
    return (
        attention_mask is not None
        and fusable(query, key, value, attention_mask)
        and attention_mask.stop_gradient
        and not output_attentions
        and all(extra is None for extra in extras)
        and not kwargs.get("sequence_parallel", False)
        and not kwargs.get("npu_is_casual", False)
        and getattr(config, "context_parallel_degree", 1) <= 1
        and not (kwargs.get("training", False) and getattr(config, "attention_dropout", 0.0) > 0)
    )


class FusedAttention:
    """A patched attention layer's `attn_func`: paddlenlp's `scaled_dot_product_attention` (`original`, the
    layer's own) with the fused op where it applies. The layer's repeat_kv has left grouped k and v heads
    unrepeated, so where the op does not apply they are repeated here before `original` runs."""

    def __init__(self, original, repeat_kv):
        self.original, self.repeat_kv = original, repeat_kv

    def __call__(self, query, config, key, value, attention_mask, output_attentions, *args, **kwargs):
        if config.use_flash_attention:
            return self.original(query, config, key, value, attention_mask, output_attentions, *args, **kwargs)
        ops = attention_ops()
        if ops is not None and attention_fusable(query, key, value, attention_mask, output_attentions, config, args, kwargs):
            return ops.fused_attention(query, key, value, attention_mask, 1.0 / math.sqrt(query.shape[-1]))[0]
        groups = query.shape[2] // key.shape[2]
        key, value = self.repeat_kv(key, groups), self.repeat_kv(value, groups)
        return self.original(query, config, key, value, attention_mask, output_attentions, *args, **kwargs)


# The patched forwards are bound to their layer (types.MethodType), so a deep copy of a patched model is
# patched on its own weights; the unfused path is the class's forward.


def _fused_norm_forward(self, hidden_states):
    if not self.config.use_fused_rms_norm and fusable(hidden_states, self.weight):
        return fused_ops().fused_rms_norm(hidden_states, self.weight, float(self.variance_epsilon))[0]
    return type(self).forward(self, hidden_states)


def _fused_mlp_forward(self, x):
    if not fusable(x):
        return type(self).forward(self, x)
    if self.fuse_attention_ffn:
        gate, up = self.gate_up_fused_proj(x).chunk(2, axis=-1)
    else:
        gate, up = self.gate_proj(x), self.up_proj(x)
    return self.down_proj(swiglu(gate, up))


def _fused_attention_forward(self, *args, **kwargs):
    token = _PATCHED_ATTENTION.set(self)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _PATCHED_ATTENTION.reset(token)


def _modeling_module(attention):
    return qwen2_modeling if isinstance(attention, qwen2_modeling.Qwen2Attention) else llama_modeling


def _mlp_is_swiglu(mlp):
    # Qwen2MLP runs silu(gate) * up when hidden_act is silu (its fuse_swiglu); LlamaMLP always does.
    return getattr(mlp, "fuse_swiglu", True)


def use_fused_kernels(model):
    """Put the fused RMSNorm, SwiGLU, rotary and attention kernels into the Qwen2/Llama layers of `model` (any layer
    holding them: a causal LM, a score model's backbone). Returns the number of layers patched: 0 when
    `paddlenlp_ops` lacks the ops or the model has no such layers. Results equal the unfused model's to
    1e-5 (float32), gradients included; tensors the kernels cannot take (not float32 CPU) run the layers'
    own code. Undone by `use_unfused_kernels(model)`."""
    if fused_ops() is None:
        return 0
    patched = 0
    for layer in model.sublayers(include_self=True):
        if getattr(layer, PATCHED, False):
            continue
        if isinstance(layer, RMS_NORMS):
            layer.forward = types.MethodType(_fused_norm_forward, layer)
        elif isinstance(layer, MLPS) and _mlp_is_swiglu(layer):
            layer.forward = types.MethodType(_fused_mlp_forward, layer)
        elif isinstance(layer, ATTENTIONS):
            _install_dispatchers()
            layer.forward = types.MethodType(_fused_attention_forward, layer)
            layer.attn_func = FusedAttention(layer.attn_func, UNFUSED_REPEAT_KV[_modeling_module(layer)])
        else:
            continue
        setattr(layer, PATCHED, True)
        patched += 1
    return patched


def use_unfused_kernels(model):
    """Undo `use_fused_kernels(model)`: the layers run their own forward again. Returns the number restored."""
    restored = 0
    for layer in model.sublayers(include_self=True):
        if getattr(layer, PATCHED, False):
            del layer.forward
            if isinstance(getattr(layer, "attn_func", None), FusedAttention):
                layer.attn_func = layer.attn_func.original
            delattr(layer, PATCHED)
            restored += 1
    return restored
