"""Qwen3 (dense, and Qwen3-MoE) on paddlenlp's Qwen2 classes, which paddlenlp 3.0.0b4 lacks.

Qwen3 is Qwen2 with three differences, as transformers' `modeling_qwen3` computes it:
- each query and key head is RMS-normalised over its `head_dim` features (`q_norm`, `k_norm`) before RoPE;
- `head_dim` is a field of its own (128 in every released size), not hidden_size / num_attention_heads;
- q/k/v carry a bias only when `attention_bias` is set (false in every released size).

Qwen3-MoE has these layers with Qwen2-MoE's sparse block without its shared expert (models/qwen2_moe.py), every
layer sparse as in the released sizes. Everything else (MLP, norms, RoPE, LM head, generation, LoRA, the
tensor-parallel plan by layer names) is Qwen2's, and the parameter names are transformers'
(`model.layers.N.self_attn.q_norm.weight` in a Hugging Face folder). The fused CPU kernels reach these layers as
they reach Qwen2's; the native decoder op does not compute the head norms, so Qwen3's decode loop and
no-gradient passes run Paddle's forward (said once per run).
"""

import paddle
from paddle import nn
from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from paddlenlp.transformers.qwen2 import modeling as qwen2_modeling

from paddle_alignment.models.layer_swap import HeadDimAttention, add_decoder_layers, without_decoder_layers
from paddle_alignment.models.qwen2_moe import SparseMoeBlock


class Qwen3Config(Qwen2Config):
    model_type = "qwen3"

    def __init__(self, head_dim=128, attention_bias=False, **kwargs):
        super().__init__(**kwargs)
        # head_dim null: hidden_size / num_attention_heads, as transformers reads it
        self.head_dim = head_dim or self.hidden_size // self.num_attention_heads
        self.attention_bias = attention_bias


class HeadRMSNorm(qwen2_modeling.Qwen2RMSNorm):
    """Qwen2's RMSNorm (and its fused CPU kernel) over each head's `head_dim` features."""

    def __init__(self, config):
        nn.Layer.__init__(self)
        self.hidden_size, self.variance_epsilon, self.config = config.head_dim, config.rms_norm_eps, config
        self.weight = paddle.create_parameter(
            shape=[config.head_dim], dtype=paddle.get_default_dtype(), default_initializer=nn.initializer.Constant(1.0)
        )


class Qwen3Attention(HeadDimAttention, qwen2_modeling.Qwen2Attention):
    modeling, passes_training = qwen2_modeling, True

    def __init__(self, config, layerwise_recompute=True, skip_recompute_ops=None):
        # Qwen2's constructor makes q/k/v/o of Qwen2's shapes, replaced at once (one layer's at a time).
        super().__init__(config, layerwise_recompute, skip_recompute_ops)
        self.use_head_dim(config, qkv_bias=config.attention_bias, o_bias=False)
        self.q_norm, self.k_norm = HeadRMSNorm(config), HeadRMSNorm(config)

    def queries_and_keys(self, hidden_states, heads):
        query, key = super().queries_and_keys(hidden_states, heads)
        return self.q_norm(query), self.k_norm(key)


class Qwen3DecoderLayer(qwen2_modeling.Qwen2DecoderLayer):
    def __init__(self, config, layerwise_recompute=False, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops)
        self.self_attn = Qwen3Attention(config, layerwise_recompute, skip_recompute_ops=self.skip_recompute_ops)


class Qwen3Model(Qwen2Model):
    config_class = Qwen3Config

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self, config, Qwen3DecoderLayer)


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    """Qwen2's causal LM over Qwen3 layers; its backbone keeps paddlenlp's attribute name (`qwen2`), the prefix
    of its parameter names in a Paddle-layout checkpoint."""

    config_class = Qwen3Config

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self.qwen2, config, Qwen3DecoderLayer)


class Qwen3MoeConfig(Qwen3Config):
    """transformers 5 writes the number of experts as `num_local_experts`, 4 as `num_experts`."""

    model_type = "qwen3_moe"

    def __init__(self, num_experts=None, num_local_experts=None, num_experts_per_tok=8, moe_intermediate_size=768,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=None, router_aux_loss_coef=0.001, **kwargs):
        super().__init__(**kwargs)
        self.num_experts = num_experts or num_local_experts or 128
        self.num_experts_per_tok, self.moe_intermediate_size = num_experts_per_tok, moe_intermediate_size
        self.norm_topk_prob, self.decoder_sparse_step = norm_topk_prob, decoder_sparse_step
        self.mlp_only_layers, self.router_aux_loss_coef = mlp_only_layers or [], router_aux_loss_coef


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config, layerwise_recompute=False, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops)  # a dense MLP, replaced at once
        self.mlp = SparseMoeBlock(config)


class Qwen3MoeModel(Qwen2Model):
    config_class = Qwen3MoeConfig

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self, config, Qwen3MoeDecoderLayer)


class Qwen3MoeForCausalLM(Qwen2ForCausalLM):
    config_class = Qwen3MoeConfig

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self.qwen2, config, Qwen3MoeDecoderLayer)
