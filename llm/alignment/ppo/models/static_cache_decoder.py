"""Decoding forward of a paddlenlp Qwen2 or Llama causal LM over a preallocated KV cache.

It reuses the model's own weights and norms and replaces the attention bookkeeping: keys and values
are written in place into per-layer buffers of shape [B, kv_heads, max_len, head_dim] allocated once
per rollout, so a decode step allocates no cache. The q/k/v projections and the gate/up projections
are concatenated once per rollout, so each layer runs four matrix products per step instead of seven.
Positions follow `generate()`: position i of the left-padded batch is i for every row.
"""

import paddle
import paddle.nn.functional as F

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def unsupported_reason(model):
    """Why the static-cache decoder cannot run `model`, or None when it can."""
    name = type(model).__name__
    if name not in SUPPORTED_ARCHITECTURES:
        return f"{name} is not one of {SUPPORTED_ARCHITECTURES}"
    config = model.config
    if getattr(config, "tensor_parallel_degree", 1) > 1:
        return "tensor-parallel models decode through generate()"
    if getattr(config, "fuse_attention_qkv", False):
        return "fused qkv projections are not supported"
    if getattr(config, "use_long_sequence_strategies", False):
        return "long-sequence rope strategies are not supported"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r} (only SwiGLU MLPs are supported)"
    return None


def concat_columns(linears):
    """One (weight, bias) computing all `linears` on the same input; bias None when none has one."""
    weight = paddle.concat([linear.weight for linear in linears], axis=1)
    biases = [linear.bias for linear in linears]
    bias = None if all(b is None for b in biases) else paddle.concat(
        [b if b is not None else paddle.zeros([l.weight.shape[1]], l.weight.dtype) for b, l in zip(biases, linears)]
    )
    return weight, bias


class LayerWeights:
    """A decoder layer's weights, with q/k/v and gate/up concatenated for fewer, larger products."""

    def __init__(self, layer):
        attention, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv_weight, self.qkv_bias = concat_columns([attention.q_proj, attention.k_proj, attention.v_proj])
        self.o_proj = attention.o_proj
        if getattr(mlp, "fuse_attention_ffn", False):
            self.gate_up_weight = mlp.gate_up_fused_proj.weight
        else:
            self.gate_up_weight, _ = concat_columns([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj

    def mlp(self, x):
        return self.down_proj(F.swiglu(F.linear(x, self.gate_up_weight)))


def rotate_half(x):
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


class StaticCacheDecoder:
    """prefill(input_ids, attention_mask) then step(tokens) -> logits of the last position, [B, V]."""

    def __init__(self, model, batch_size, max_len, prompt_mask):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"static-cache decoding unavailable: {reason}")
        self.model = model
        self.base = getattr(model, model.base_model_prefix)
        self.layers = [LayerWeights(layer) for layer in self.base.layers]
        attention = self.base.layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = (
            attention.num_heads,
            attention.num_key_value_heads,
            attention.head_dim,
        )
        self.groups = self.num_heads // self.num_kv_heads
        dtype = self.base.embed_tokens.weight.dtype
        shape = [batch_size, self.num_kv_heads, max_len, self.head_dim]
        self.keys = [paddle.zeros(shape, dtype=dtype) for _ in self.base.layers]
        self.values = [paddle.zeros(shape, dtype=dtype) for _ in self.base.layers]
        # Additive key mask over the whole buffer: prompt padding is masked, generated tokens never are.
        prompt_len = prompt_mask.shape[1]
        valid = paddle.concat([prompt_mask, paddle.ones([batch_size, max_len - prompt_len], prompt_mask.dtype)], axis=1)
        lowest = paddle.finfo(paddle.float32).min
        self.key_mask = ((1 - valid.astype("float32")) * lowest).reshape([batch_size, 1, 1, 1, max_len])
        cos, sin = attention.rotary_emb(self.keys[0], seq_len=max_len)
        self.cos, self.sin = cos.squeeze([0, 2]), sin.squeeze([0, 2])  # [max_len, head_dim]
        self.position = 0

    def rope(self, x, start):
        length = x.shape[1]
        cos = self.cos[start : start + length].unsqueeze([0, 2]).astype(x.dtype)
        sin = self.sin[start : start + length].unsqueeze([0, 2]).astype(x.dtype)
        return x * cos + rotate_half(x) * sin

    def attention(self, layer_index, layer, hidden, start):
        """Self-attention of positions [start, start + L) against the cache up to them."""
        batch, length, _ = hidden.shape
        qkv = F.linear(hidden, layer.qkv_weight, layer.qkv_bias)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = paddle.split(qkv, [q_size, kv_size, kv_size], axis=-1)
        q = q.reshape([batch, length, self.num_heads, self.head_dim])
        k = k.reshape([batch, length, self.num_kv_heads, self.head_dim])
        v = v.reshape([batch, length, self.num_kv_heads, self.head_dim])
        q, k = self.rope(q, start), self.rope(k, start)
        end = start + length
        self.keys[layer_index][:, :, start:end] = k.transpose([0, 2, 1, 3])
        self.values[layer_index][:, :, start:end] = v.transpose([0, 2, 1, 3])
        keys = self.keys[layer_index][:, :, :end].unsqueeze(2)  # [B, KV, 1, end, D]
        values = self.values[layer_index][:, :, :end].unsqueeze(2)
        # Heads h = kv * groups + g share kv head kv, as paddlenlp's repeat_kv arranges them.
        q = q.reshape([batch, length, self.num_kv_heads, self.groups, self.head_dim]).transpose([0, 2, 3, 1, 4])
        scores = paddle.matmul(q, keys, transpose_y=True).astype("float32") * (self.head_dim**-0.5)
        mask = self.key_mask[..., :end]
        if length > 1:  # prefill: causal within the new positions
            causal = paddle.triu(paddle.full([length, end], paddle.finfo(paddle.float32).min), diagonal=start + 1)
            mask = mask + causal
        probs = F.softmax(scores + mask, axis=-1).astype(values.dtype)
        out = paddle.matmul(probs, values)  # [B, KV, G, L, D]
        out = out.transpose([0, 3, 1, 2, 4]).reshape([batch, length, self.num_heads * self.head_dim])
        return layer.o_proj(out)

    def forward(self, input_ids):
        start = self.position
        hidden = self.base.embed_tokens(input_ids)
        for index, layer in enumerate(self.layers):
            hidden = hidden + self.attention(index, layer, layer.input_norm(hidden), start)
            hidden = hidden + layer.mlp(layer.post_norm(hidden))
        self.position = start + input_ids.shape[1]
        last = self.base.norm(hidden[:, -1:])
        return self.model.lm_head(last)[:, -1].astype("float32")

    def prefill(self, input_ids):
        return self.forward(input_ids)

    def step(self, tokens):
        return self.forward(tokens.unsqueeze(-1))
