"""Decoding forward of a paddlenlp Qwen2 or Llama causal LM over a preallocated KV cache.

It reuses the model's own weights and norms and replaces the attention bookkeeping: keys and values
are written in place into per-layer buffers of shape [B, kv_heads, max_len, head_dim] allocated once
per rollout, so a decode step allocates no cache. The q/k/v projections and the gate/up projections
are concatenated once per rollout, so each layer runs four matrix products per step instead of seven.
Positions follow `generate()`: position i of the left-padded batch is i for every row.

A float32 CPU model on one device runs the whole forward in one native op per step instead
(models/native_forward.py, csrc/decoder_ops.cc); the eager code here serves everything else (GPU, bf16,
tensor parallel) and PADDLE_ALIGNMENT_FUSED_KERNELS=off.

A model split by the tensor-parallel plan (models/tensor_parallel.py) decodes on each rank's part of the
weights: its own attention heads and MLP columns, an all-reduce of the partial sums after the row-parallel
o/down products and the vocab-parallel embedding lookup, and the vocab-parallel logits gathered whole, so
every rank of the group samples the same tokens.
"""

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F

from paddle_alignment.models.decoder_weights import LayerWeights, LMHead, RMSNorm, VocabParallelEmbedding, unsupported_reason
from paddle_alignment.models.fused_kernels import rotary
from paddle_alignment.models.native_forward import NativeCacheSession, NativeDecoder, native_ops, native_unsupported_reason
from paddle_alignment.models.tensor_parallel import is_tensor_parallel, split_group

def tensor_parallel_group(model):
    """The group over which `model`'s weights are split, or None."""
    return split_group(model) if is_tensor_parallel(model) else None


class StaticCacheDecoder:
    """prefill(input_ids, attention_mask) then step(tokens) -> logits of the last position, [B, V].

    With `carry` (multi-turn rollouts; only where `carries_cache(model)`: the native forward), positions count
    each row's real tokens and `row_caches` gives rows' keys and values for the next turn's decoder, which
    `continuing` builds from them: only the tokens after them are prefilled."""

    def __init__(self, model, batch_size, max_len, prompt_mask, carry=False, session=None):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"static-cache decoding unavailable: {reason}")
        self.group = tensor_parallel_group(model)
        if session is None:
            native = NativeDecoder.for_model(model)
            if carry and native is None:
                raise ValueError("carrying the KV cache across turns needs the native forward (carries_cache)")
            session = None if native is None else NativeCacheSession(native, batch_size, max_len, prompt_mask, carry)
        self.native = session
        if self.native is not None:
            return
        degree = 1 if self.group is None else self.group.nranks
        base = getattr(model, model.base_model_prefix)
        self.layers = [LayerWeights(layer, self.group) for layer in base.layers]
        self.embed_tokens, self.norm = VocabParallelEmbedding(base.embed_tokens, self.group), RMSNorm(base.norm)
        self.lm_head = LMHead(model.lm_head, self.group)
        attention = base.layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = (
            attention.num_heads // degree,
            attention.num_key_value_heads // degree,
            attention.head_dim,
        )
        self.groups = self.num_heads // self.num_kv_heads
        dtype = self.embed_tokens.weight.dtype
        shape = [batch_size, self.num_kv_heads, max_len, self.head_dim]
        self.keys = [paddle.zeros(shape, dtype=dtype) for _ in self.layers]
        self.values = [paddle.zeros(shape, dtype=dtype) for _ in self.layers]
        # Additive key mask over the whole buffer: prompt padding is masked, generated tokens never are.
        prompt_len = prompt_mask.shape[1]
        valid = paddle.concat([prompt_mask, paddle.ones([batch_size, max_len - prompt_len], prompt_mask.dtype)], axis=1)
        lowest = paddle.finfo(paddle.float32).min
        self.key_mask = ((1 - valid.astype("float32")) * lowest).reshape([batch_size, 1, 1, 1, max_len])
        cos, sin = attention.rotary_emb(self.keys[0], seq_len=max_len)  # [1, at least max_len, 1, head_dim]
        self.cos, self.sin = cos[:, :max_len].astype(dtype), sin[:, :max_len].astype(dtype)
        self.position = 0

    def rope(self, q, k, start):
        """q and k of positions [start, start + L) rotated (paddlenlp's apply_rotary_pos_emb)."""
        batch, length = q.shape[:2]
        positions = paddle.arange(start, start + length, dtype="int64").unsqueeze(0).expand([batch, length])
        return rotary(q, k, self.cos, self.sin, positions)

    def attention(self, layer_index, layer, hidden, start):
        """Self-attention of positions [start, start + L) against the cache up to them."""
        batch, length, _ = hidden.shape
        qkv = F.linear(hidden, layer.qkv_weight, layer.qkv_bias)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = paddle.split(qkv, [q_size, kv_size, kv_size], axis=-1)
        q = q.reshape([batch, length, self.num_heads, self.head_dim])
        k = k.reshape([batch, length, self.num_kv_heads, self.head_dim])
        v = v.reshape([batch, length, self.num_kv_heads, self.head_dim])
        q, k = self.rope(q, k, start)
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
        if self.native is not None:
            return self.native.forward(input_ids)
        start = self.position
        hidden = self.embed_tokens(input_ids)
        for index, layer in enumerate(self.layers):
            hidden = hidden + self.attention(index, layer, layer.input_norm(hidden), start)
            hidden = hidden + layer.mlp(layer.post_norm(hidden))
        self.position = start + input_ids.shape[1]
        return self.lm_head(self.norm(hidden[:, -1])).astype("float32")

    @staticmethod
    def carries_cache(model):
        """Whether this decoder carries a row's KV cache from turn to turn for `model` (the native forward: a
        float32 CPU model on one device); elsewhere each turn prefills the whole trajectory again."""
        return native_ops() is not None and native_unsupported_reason(model) is None

    @classmethod
    def continuing(cls, model, caches, block_mask, max_dec):
        """The decoder of a turn whose rows continue from `caches` (RowCache each) with the left-padded block of
        `block_mask` [B, L] next tokens (prefilled by `prefill`), then up to `max_dec` generated ones."""
        session = NativeCacheSession.continuing(NativeDecoder.for_model(model), caches, block_mask, max_dec)
        return cls(model, None, None, None, carry=True, session=session)

    def row_caches(self, rows, counts):
        """The RowCaches of the first `counts` real tokens of rows `rows` (positions in the batch as it is now)."""
        return self.native.row_caches(rows, counts)

    def same_on_every_rank(self, seed):
        """`seed` as rank 0 of the tensor-parallel group drew it, so that every rank samples the same tokens."""
        if self.group is None:
            return seed
        value = paddle.to_tensor([seed], dtype="int64")
        dist.broadcast(value, src=self.group.ranks[0], group=self.group)
        return int(value)

    def prefill(self, input_ids):
        return self.forward(input_ids)

    def repeat_rows(self, copies):
        """Make each row `copies` adjacent rows with its cache and mask (a prompt prefilled once, then sampled
        several times)."""
        if self.native is not None:
            return self.native.repeat_rows(copies)
        self.keys = [paddle.repeat_interleave(k, copies, axis=0) for k in self.keys]
        self.values = [paddle.repeat_interleave(v, copies, axis=0) for v in self.values]
        self.key_mask = paddle.repeat_interleave(self.key_mask, copies, axis=0)

    def keep_rows(self, kept):
        """Keep only the rows at positions `kept` (an int64 index tensor): the decode loop drops finished rows."""
        if self.native is not None:
            return self.native.keep_rows(kept)
        self.keys = [paddle.index_select(k, kept) for k in self.keys]
        self.values = [paddle.index_select(v, kept) for v in self.values]
        self.key_mask = paddle.index_select(self.key_mask, kept)

    def step(self, tokens):
        return self.forward(tokens.unsqueeze(-1))
