"""Qwen3 (dense) on paddlenlp's Qwen2 classes, which paddlenlp 3.0.0b4 lacks.

Qwen3 is Qwen2 with three differences, as transformers' `modeling_qwen3` computes it:
- each query and key head is RMS-normalised over its `head_dim` features (`q_norm`, `k_norm`) before RoPE;
- `head_dim` is a field of its own (128 in every released size), not hidden_size / num_attention_heads;
- q/k/v carry a bias only when `attention_bias` is set (false in every released size).

Everything else (MLP, norms, RoPE tables, LM head, generation, LoRA, the tensor-parallel plan by layer names)
is Qwen2's, and the parameter names are transformers' (`model.layers.N.self_attn.q_norm.weight` in a Hugging Face
folder). The fused CPU kernels reach these layers as they reach Qwen2's (the attention looks paddlenlp's rotary
and repeat_kv up in its module at call time, which is where the kernels hook in); the native decoder op does not
compute the head norms, so Qwen3's decode loop and no-gradient passes run Paddle's forward (said once per run).
"""

from contextlib import contextmanager

import paddle
from paddle import nn
from paddle.distributed.fleet.recompute.recompute import recompute
from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from paddlenlp.transformers.qwen2 import modeling as qwen2_modeling
from paddlenlp.transformers.refined_recompute import get_skip_recompute_ops


class Qwen3Config(Qwen2Config):
    model_type = "qwen3"

    def __init__(self, head_dim=128, attention_bias=False, **kwargs):
        super().__init__(**kwargs)
        self.head_dim = head_dim or self.hidden_size // self.num_attention_heads  # transformers reads None so
        self.attention_bias = attention_bias


class HeadRMSNorm(qwen2_modeling.Qwen2RMSNorm):
    """Qwen2's RMSNorm (and its fused CPU kernel) over each head's `head_dim` features."""

    def __init__(self, config):
        nn.Layer.__init__(self)
        self.hidden_size, self.variance_epsilon, self.config = config.head_dim, config.rms_norm_eps, config
        self.weight = paddle.create_parameter(
            shape=[config.head_dim], dtype=paddle.get_default_dtype(), default_initializer=nn.initializer.Constant(1.0)
        )


class Qwen3Attention(qwen2_modeling.Qwen2Attention):
    def __init__(self, config, layerwise_recompute=True, skip_recompute_ops=None):
        for flag in ("fuse_attention_qkv", "sequence_parallel"):
            if getattr(config, flag, False):
                raise ValueError(f"{flag}: Qwen3's attention here computes q, k and v apart, without sequence parallel")
        # Qwen2's constructor makes its own q/k/v/o of Qwen2's shapes; they are replaced at once (one layer's
        # attention at a time, freed as the next is built).
        super().__init__(config, layerwise_recompute, skip_recompute_ops)
        self.head_dim = config.head_dim
        bias = None if config.attention_bias else False
        inner = config.num_attention_heads * self.head_dim
        self.q_proj = qwen2_modeling.Linear(config.hidden_size, inner, bias_attr=bias)
        self.k_proj = qwen2_modeling.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias_attr=bias)
        self.v_proj = qwen2_modeling.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias_attr=bias)
        self.o_proj = qwen2_modeling.Linear(inner, config.hidden_size, bias_attr=False)
        self.q_norm, self.k_norm = HeadRMSNorm(config), HeadRMSNorm(config)
        self.rotary_emb = qwen2_modeling.Qwen2RotaryEmbedding(self.head_dim, self.max_position_embeddings, self.rope_theta)

    def forward(self, hidden_states, position_ids=None, past_key_value=None, attention_mask=None,
                output_attentions=False, use_cache=False, attn_mask_startend_row_indices=None, **kwargs):
        heads = [0, 0, -1, self.head_dim]  # [batch, seq, heads, head_dim]; -1: this rank's heads under tensor parallel
        query = self.q_norm(self.q_proj(hidden_states).reshape(heads))
        key = self.k_norm(self.k_proj(hidden_states).reshape(heads))
        value = self.v_proj(hidden_states).reshape(heads)
        past_length = 0 if past_key_value is None else past_key_value[0].shape[1]
        cos, sin = self.rotary_emb(value, seq_len=key.shape[1] + past_length)
        query, key = qwen2_modeling.apply_rotary_pos_emb(query, key, cos, sin, position_ids)
        if past_key_value is not None:
            key = paddle.concat([past_key_value[0], key], axis=1)
            value = paddle.concat([past_key_value[1], value], axis=1)
        cache = (key, value) if use_cache else None
        if not self.config.use_flash_attention:
            key = qwen2_modeling.repeat_kv(key, self.num_key_value_groups)
            value = qwen2_modeling.repeat_kv(value, self.num_key_value_groups)
        attend = (recompute if self.enable_recompute and self.layerwise_recompute
                  and self.recompute_granularity == "core_attn" and not hidden_states.stop_gradient else None)
        arguments = (query, self.config, key, value, attention_mask, output_attentions)
        options = {"attn_mask_startend_row_indices": attn_mask_startend_row_indices, "training": self.training,
                   "sequence_parallel": False}
        if attend is not None:
            outputs = attend(self.attn_func, *arguments, **options, use_reentrant=self.config.recompute_use_reentrant)
        else:
            outputs = self.attn_func(*arguments, **options)
        attention, weights = outputs if output_attentions else (outputs, None)
        results = (self.o_proj(attention),) + ((weights,) if output_attentions else ()) + ((cache,) if use_cache else ())
        return results[0] if len(results) == 1 else results


class Qwen3DecoderLayer(qwen2_modeling.Qwen2DecoderLayer):
    def __init__(self, config, layerwise_recompute=False, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops)
        self.self_attn = Qwen3Attention(config, layerwise_recompute, skip_recompute_ops=self.skip_recompute_ops)


@contextmanager
def without_decoder_layers(config):
    """paddlenlp's Qwen2 constructors, run inside, build no decoder layers (Qwen3's take their place, so Qwen2's
    are never allocated)."""
    layers, config.num_hidden_layers = config.num_hidden_layers, 0
    try:
        yield
    finally:
        config.num_hidden_layers = layers


def add_decoder_layers(backbone, config):
    backbone.layers = nn.LayerList([
        Qwen3DecoderLayer(config, layerwise_recompute=index not in backbone.no_recompute_layers,
                          skip_recompute_ops=get_skip_recompute_ops(config, index))
        for index in range(config.num_hidden_layers)
    ])


class Qwen3Model(Qwen2Model):
    config_class = Qwen3Config

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self, config)


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    """Qwen2's causal LM over Qwen3 layers; its backbone keeps paddlenlp's attribute name (`qwen2`), the prefix
    of its parameter names in a Paddle-layout checkpoint."""

    config_class = Qwen3Config

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self.qwen2, config)
