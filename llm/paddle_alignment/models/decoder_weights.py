"""The weights of a paddlenlp Qwen2 or Llama decoder as the fast forward passes use them: q/k/v and gate/up
concatenated, this rank's part of each split weight, and the collectives that complete a row-parallel
product, a vocab-parallel embedding lookup or LM head. Shared by the eager static-cache decoder
(static_cache_decoder.py) and the native forward (native_forward.py)."""

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F

from paddle_alignment.distributed import holds_sliced_weights
from paddle_alignment.models.fused_kernels import rms_norm, swiglu
from paddle_alignment.models.tensor_parallel import local_value

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def unsupported_reason(model):
    """Why the static-cache decoder cannot run `model`, or None when it can."""
    name = type(model).__name__
    if name not in SUPPORTED_ARCHITECTURES:
        return f"{name} is not one of {SUPPORTED_ARCHITECTURES}"
    config = model.config
    if getattr(config, "tensor_parallel_degree", 1) > 1:
        return "models with fleet's tensor-parallel layers decode through generate()"
    if getattr(config, "fuse_attention_qkv", False):
        return "fused qkv projections are not supported"
    if getattr(config, "use_long_sequence_strategies", False):
        return "long-sequence rope strategies are not supported"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r} (only SwiGLU MLPs are supported)"
    if holds_sliced_weights(model):
        return "sharding stage 3 holds the weights in slices, whole only within each layer's forward"
    return None


def concat_columns(linears):
    """One (weight, bias) computing all `linears` on the same input (this rank's columns of each);
    bias None when none has one."""
    weights = [local_value(linear.weight) for linear in linears]
    biases = [None if linear.bias is None else local_value(linear.bias) for linear in linears]
    bias = None if all(b is None for b in biases) else paddle.concat(
        [b if b is not None else paddle.zeros([w.shape[1]], w.dtype) for b, w in zip(biases, weights)]
    )
    return paddle.concat(weights, axis=1), bias


class RowParallelLinear:
    """A linear layer over this rank's rows of the weight: partial products summed over the group (the
    bias, whole on every rank, added once after the sum)."""

    def __init__(self, linear, group):
        self.weight, self.group = local_value(linear.weight), group
        self.bias = None if linear.bias is None else local_value(linear.bias)

    def __call__(self, x):
        out = paddle.matmul(x, self.weight)
        if self.group is not None:
            dist.all_reduce(out, group=self.group)
        return out if self.bias is None else out + self.bias


class RMSNorm:
    """paddlenlp's Qwen2/Llama RMSNorm (float32 statistics) on the norm's local weight (the fused kernel on CPU)."""

    def __init__(self, norm):
        self.weight, self.epsilon = local_value(norm.weight), norm.variance_epsilon

    def __call__(self, x):
        return rms_norm(x, self.weight, self.epsilon)


class LayerWeights:
    """A decoder layer's weights (this rank's part of them), with q/k/v and gate/up concatenated for
    fewer, larger products."""

    def __init__(self, layer, group):
        attention, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = RMSNorm(layer.input_layernorm), RMSNorm(layer.post_attention_layernorm)
        self.qkv_weight, self.qkv_bias = concat_columns([attention.q_proj, attention.k_proj, attention.v_proj])
        self.o_proj = RowParallelLinear(attention.o_proj, group)
        if getattr(mlp, "fuse_attention_ffn", False):
            self.gate_up_weight = local_value(mlp.gate_up_fused_proj.weight)
        else:
            self.gate_up_weight, _ = concat_columns([mlp.gate_proj, mlp.up_proj])
        self.down_proj = RowParallelLinear(mlp.down_proj, group)

    def mlp(self, x):
        gate, up = paddle.chunk(F.linear(x, self.gate_up_weight), 2, axis=-1)
        return self.down_proj(swiglu(gate, up))


class VocabParallelEmbedding:
    """The embedding lookup on this rank's rows of the table (all of them when it is whole): ids outside
    them look up zeros, and the group's sum holds every id's row."""

    def __init__(self, embedding, group):
        self.weight = local_value(embedding.weight)
        self.split = group is not None and embedding.weight.is_dist() and self.weight.shape[0] < embedding.weight.shape[0]
        self.group = group
        self.start = group.rank * self.weight.shape[0] if self.split else 0

    def __call__(self, ids):
        if not self.split:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(paddle.where(inside, local, paddle.zeros_like(local)), self.weight)
        rows = rows * inside.unsqueeze(-1).astype(rows.dtype)
        dist.all_reduce(rows, group=self.group)
        return rows


class LMHead:
    """Logits over the whole vocabulary from this rank's part of the LM head, gathered over the group when
    the head is split over the vocabulary."""

    def __init__(self, lm_head, group):
        self.weight = local_value(lm_head.weight)
        self.transpose = getattr(lm_head, "transpose_y", False)  # tied to the [vocab, hidden] embedding
        self.group = group if lm_head.weight.is_dist() and self.weight.shape != lm_head.weight.shape else None

    def __call__(self, hidden):
        logits = paddle.matmul(hidden, self.weight, transpose_y=self.transpose)
        if self.group is None:
            return logits
        parts = []
        dist.all_gather(parts, logits, group=self.group)
        return paddle.concat(parts, axis=-1)
