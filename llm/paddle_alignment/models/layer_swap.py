"""paddlenlp's Qwen2 and Llama models with attention layers of another kind: how the project's own families
(Qwen3, ERNIE 4.5) reuse everything of paddlenlp's but what differs.

paddlenlp's constructors build their own decoder layers, so they run with none (`without_decoder_layers`) and
the family's are added after (`add_decoder_layers`): paddlenlp's are never allocated. `HeadDimAttention` is the
attention both families share: heads `config.head_dim` wide (not hidden_size / num_attention_heads), q/k/v and o
built for them, and one forward that calls paddlenlp's rotary, repeat_kv and attention through their module at
call time, where the fused CPU kernels hook in (models/fused_kernels.py). A family says what its queries and keys
are (`queries_and_keys`) and how RoPE turns them (`rotate`).
"""

from contextlib import contextmanager

import paddle
from paddle import nn
from paddle.distributed.fleet.recompute.recompute import recompute
from paddlenlp.transformers.refined_recompute import get_skip_recompute_ops

from paddle_alignment.models.rope import RopeTables, RotaryEmbedding, rope_settings


@contextmanager
def without_decoder_layers(config):
    """paddlenlp's model constructors, run inside, build no decoder layers."""
    layers, config.num_hidden_layers = config.num_hidden_layers, 0
    try:
        yield
    finally:
        config.num_hidden_layers = layers


def add_decoder_layers(backbone, config, layer_class):
    """Give `backbone` (a paddlenlp Qwen2Model or LlamaModel built without layers) `layer_class` layers."""
    backbone.layers = nn.LayerList([
        layer_class(config, layerwise_recompute=index not in backbone.no_recompute_layers,
                    skip_recompute_ops=get_skip_recompute_ops(config, index))
        for index in range(config.num_hidden_layers)
    ])


class HeadDimAttention:
    """Mixed into a subclass of paddlenlp's Qwen2Attention or LlamaAttention, after paddlenlp's constructor ran:
    `use_head_dim` replaces q/k/v/o and the rotary embedding by ones for `config.head_dim`. `modeling` is
    paddlenlp's module of the base class."""

    modeling = None
    passes_training = False  # whether the module's scaled_dot_product_attention takes `training`
    # What the module's decoder layer passes by position after use_cache (Llama's: alibi first).
    positional_extras = ("attn_mask_startend_row_indices",)

    def use_head_dim(self, config, qkv_bias, o_bias):
        for flag in ("fuse_attention_qkv", "sequence_parallel"):
            if getattr(config, flag, False):
                raise ValueError(f"{flag}: the {config.model_type} attention here computes q, k and v apart, "
                                 "without sequence parallel")
        self.head_dim, inner = config.head_dim, config.num_attention_heads * config.head_dim
        kv = config.num_key_value_heads * config.head_dim
        qkv_bias, o_bias = (None if bias else False for bias in (qkv_bias, o_bias))
        self.q_proj = self.modeling.Linear(config.hidden_size, inner, bias_attr=qkv_bias)
        self.k_proj = self.modeling.Linear(config.hidden_size, kv, bias_attr=qkv_bias)
        self.v_proj = self.modeling.Linear(config.hidden_size, kv, bias_attr=qkv_bias)
        self.o_proj = self.modeling.Linear(inner, config.hidden_size, bias_attr=o_bias)
        # The model's loaders share one table among the layers (rope.use_rope_tables).
        self.rotary_emb = RotaryEmbedding(RopeTables(rope_settings(config), config.head_dim, config.max_position_embeddings))

    def queries_and_keys(self, hidden_states, heads):
        return self.q_proj(hidden_states).reshape(heads), self.k_proj(hidden_states).reshape(heads)

    def rotate(self, query, key, cos, sin, position_ids):
        return self.modeling.apply_rotary_pos_emb(query, key, cos, sin, position_ids)

    def forward(self, hidden_states, position_ids=None, past_key_value=None, attention_mask=None,
                output_attentions=False, use_cache=False, *extras, **named):
        named.update(zip(self.positional_extras, extras))
        if named.get("alibi") is not None:
            raise ValueError(f"alibi: the {self.config.model_type} attention here has rotary position embeddings only")
        heads = [0, 0, -1, self.head_dim]  # [batch, seq, heads, head_dim]; -1: this rank's heads under tensor parallel
        query, key = self.queries_and_keys(hidden_states, heads)
        value = self.v_proj(hidden_states).reshape(heads)
        past_length = 0 if past_key_value is None else past_key_value[0].shape[1]
        cos, sin = self.rotary_emb(value, seq_len=key.shape[1] + past_length)
        query, key = self.rotate(query, key, cos, sin, position_ids)
        if past_key_value is not None:
            key = paddle.concat([past_key_value[0], key], axis=1)
            value = paddle.concat([past_key_value[1], value], axis=1)
        cache = (key, value) if use_cache else None
        if not self.config.use_flash_attention:
            key = self.modeling.repeat_kv(key, self.num_key_value_groups)
            value = self.modeling.repeat_kv(value, self.num_key_value_groups)
        arguments = (query, self.config, key, value, attention_mask, output_attentions)
        options = {"attn_mask_startend_row_indices": named.get("attn_mask_startend_row_indices"), "sequence_parallel": False}
        if self.passes_training:
            options["training"] = self.training
        if (self.enable_recompute and self.layerwise_recompute and self.recompute_granularity == "core_attn"
                and not hidden_states.stop_gradient):
            outputs = recompute(self.attn_func, *arguments, **options, use_reentrant=self.config.recompute_use_reentrant)
        else:
            outputs = self.attn_func(*arguments, **options)
        attention, weights = outputs if output_attentions else (outputs, None)
        results = (self.o_proj(attention),) + ((weights,) if output_attentions else ()) + ((cache,) if use_cache else ())
        return results[0] if len(results) == 1 else results
