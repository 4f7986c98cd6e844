"""ERNIE 4.5 (dense: ERNIE-4.5-0.3B) on paddlenlp's Llama classes, which paddlenlp 3.0.0b4 lacks.

ERNIE 4.5 is Llama with three differences, as transformers' `modeling_ernie4_5` computes it:
- RoPE turns interleaved pairs of features (0 and 1, 2 and 3, ...) where Llama's turns the two halves of a head;
- `head_dim` is a field of its own (128), not hidden_size / num_attention_heads;
- with `use_bias` every projection (q/k/v/o and the MLP's) has a bias (false in the released sizes).

The parameter names are transformers' (`model.layers.N.self_attn.q_proj.weight` in a Hugging Face folder). The
native decoder op computes Llama's RoPE only, so ERNIE's decode loop and no-gradient passes run Paddle's forward
(said once per run).
"""

import paddle
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaModel
from paddlenlp.transformers.llama import modeling as llama_modeling

from paddle_alignment.models.layer_swap import HeadDimAttention, add_decoder_layers, without_decoder_layers

# The names a config.json gives the causal LM: transformers' own, and ERNIE's remote code and Paddle releases'.
ARCHITECTURES = ("Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM")


class Ernie4_5Config(LlamaConfig):
    model_type = "ernie4_5"

    def __init__(self, head_dim=128, use_bias=False, **kwargs):
        kwargs.setdefault("rope_theta", 500000.0)
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(**kwargs)
        self.head_dim = head_dim or self.hidden_size // self.num_attention_heads  # null: as transformers reads it
        self.use_bias = use_bias


def rotate_pairs(x):
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): RoPE's quarter turn of each interleaved pair."""
    pairs = x.reshape([*x.shape[:-1], -1, 2])
    return paddle.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


def interleaved_rotary(query, key, cos, sin, position_ids):
    """RoPE over interleaved pairs: the rows `position_ids` [B, S] of the [1, L, 1, D] tables (whose two halves
    are equal: Llama's layout), each frequency repeated for the two features of its pair."""
    half = cos.shape[-1] // 2
    cos, sin = (paddle.repeat_interleave(table[0, :, 0, :half], 2, axis=-1) for table in (cos, sin))  # [L, D]
    if position_ids is None:
        position_ids = paddle.arange(query.shape[1]).unsqueeze(0)
    cos, sin = cos[position_ids].unsqueeze(2), sin[position_ids].unsqueeze(2)  # [B, S, 1, D]
    return query * cos + rotate_pairs(query) * sin, key * cos + rotate_pairs(key) * sin


class Ernie4_5Attention(HeadDimAttention, llama_modeling.LlamaAttention):
    modeling, positional_extras = llama_modeling, ("alibi", "attn_mask_startend_row_indices")

    def __init__(self, config, layerwise_recompute=False, skip_recompute_ops=None):
        # Llama's constructor makes q/k/v/o of Llama's shapes, replaced at once (one layer's at a time).
        super().__init__(config, layerwise_recompute, skip_recompute_ops)
        self.use_head_dim(config, qkv_bias=config.use_bias, o_bias=config.use_bias)

    def rotate(self, query, key, cos, sin, position_ids):
        return interleaved_rotary(query, key, cos, sin, position_ids)


class Ernie4_5DecoderLayer(llama_modeling.LlamaDecoderLayer):
    def __init__(self, config, layerwise_recompute=False, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops)
        self.self_attn = Ernie4_5Attention(config, layerwise_recompute, skip_recompute_ops=self.skip_recompute_ops)
        if config.use_bias:
            mlp = self.mlp
            mlp.gate_proj = llama_modeling.Linear(config.hidden_size, config.intermediate_size)
            mlp.up_proj = llama_modeling.Linear(config.hidden_size, config.intermediate_size)
            mlp.down_proj = llama_modeling.Linear(config.intermediate_size, config.hidden_size)


class Ernie4_5Model(LlamaModel):
    config_class = Ernie4_5Config

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self, config, Ernie4_5DecoderLayer)


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    """Llama's causal LM over ERNIE 4.5 layers; its backbone keeps paddlenlp's attribute name (`llama`), the
    prefix of its parameter names in a Paddle-layout checkpoint."""

    config_class = Ernie4_5Config

    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self.llama, config, Ernie4_5DecoderLayer)
