"""What `share_prompt_forward` needs besides the forward itself (ppo_model_utils.shared_prompt_hidden): which
rows of a micro-batch share a prompt, and a model's paddlenlp layers set to run a response's forward after its
prompt's cached keys and values, in the forward and in a recompute of it in the backward."""

import logging
import weakref

import numpy as np
import paddle

from paddle_alignment.models.fused_kernels import ATTENTIONS

logger = logging.getLogger(__name__)


PREPARED_FOR_SHARED_PROMPTS = weakref.WeakSet()


def prepare_for_shared_prompts(model):
    """Set `model`'s paddlenlp layers, once and from then on, to run the shared-prompt forwards as they need (for
    good, not around the forwards, since a recompute runs a forward again in the backward):
    - recompute without reentrancy: Paddle's reentrant recompute keeps gradients only for the tensors handed to
      it or returned by it directly, not for those in a tuple, so the keys and values the prompt's forward
      returns and the responses' forward takes (past_key_values) would carry no gradient back to the prompt;
    - the unfused rotary embedding (the same rotation): paddlenlp's fused one asserts there are no cached keys;
    - AttentionAfterCache in the attention layers on the flash-attention branch, where paddlenlp asks Paddle's
      scaled_dot_product_attention for a causal mask besides the mask, which with fewer queries than keys every
      backend Paddle 3.3 can choose aligns to the first key, dropping the padding mask (docs/real_size.md)."""
    if model in PREPARED_FOR_SHARED_PROMPTS:
        return
    layers = model.sublayers(include_self=True)
    reentrant = {id(layer.config): layer.config for layer in layers
                 if getattr(getattr(layer, "config", None), "recompute_use_reentrant", False)}
    attentions = [layer for layer in layers if isinstance(layer, ATTENTIONS)]
    fused_rope = [layer for layer in attentions if layer.use_fused_rope]
    for config in reentrant.values():
        config.recompute_use_reentrant = False
    for layer in fused_rope:
        layer.use_fused_rope = False
    for layer in attentions:
        if layer.config.use_flash_attention:  # elsewhere the mask is added as given (and the CPU's fused op stays seen)
            layer.attn_func = AttentionAfterCache(layer.attn_func)
    PREPARED_FOR_SHARED_PROMPTS.add(model)
    changes = ["recomputes without reentrancy"] * bool(reentrant) + ["rotates unfused"] * bool(fused_rope)
    if changes:
        logger.info(f"share_prompt_forward: {type(model).__name__} now {' and '.join(changes)} (docs/real_size.md)")


class AttentionAfterCache:
    """The `attn_func` of an attention layer on paddlenlp's flash-attention branch (prepare_for_shared_prompts):
    where queries follow cached keys, scaled_dot_product_attention given only the mask, on any device;
    paddlenlp's own (`original`) for one query or none cached."""

    def __init__(self, original):
        self.original = original

    def __call__(self, query, config, key, value, attention_mask, output_attentions, *args, **kwargs):
        batch, queries, heads, head_dim = query.shape
        if queries in (1, key.shape[1]):  # one query: paddlenlp asks no triangle
            return self.original(query, config, key, value, attention_mask, output_attentions, *args, **kwargs)
        alibi = args[0] if args else kwargs.get("alibi")  # Llama's, by position under core_attn recompute
        extras = {"alibi": alibi is not None, "output_attentions": bool(output_attentions),
                  "sequence_parallel": bool(kwargs.get("sequence_parallel")),
                  "attn_mask_startend_row_indices": kwargs.get("attn_mask_startend_row_indices") is not None,
                  "reshard_layer": kwargs.get("reshard_layer") is not None}
        if any(extras.values()):
            unsupported = ", ".join(name for name, on in extras.items() if on)
            raise ValueError(f"share_prompt_forward: the responses' attention after a shared prompt runs without {unsupported}")
        if attention_mask is None:  # dropped by paddlenlp as causal: no prompt is padded (its first key would be masked)
            attention_mask = causal_mask_after_cache(batch, queries, key.shape[1], query.dtype)
        out = paddle.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=False)
        return out.reshape([batch, queries, heads * head_dim])


def causal_mask_after_cache(batch, queries, keys, dtype):
    """[batch, 1, queries, keys] additive mask: query i, the (keys - queries + i)-th token, sees the keys up to
    itself (every row its own, as a mask paddlenlp makes: a kernel need not broadcast it)."""
    visible = paddle.tril(paddle.ones([queries, keys], dtype="bool"), diagonal=keys - queries)
    mask = paddle.where(visible, 0.0, paddle.finfo(dtype).min).astype(dtype)
    return mask.expand([batch, 1, queries, keys])


def prompt_groups(exp):
    """(the first row of each distinct prompt, each row's index among them) [G], [B] int64: rows whose prompt
    tokens and mask are equal (a GRPO group's samples) share a prompt."""
    prompt_len = exp.prompt_len
    prompts = paddle.concat([exp.input_ids[:, :prompt_len], exp.attention_mask[:, :prompt_len].astype("int64")], axis=1)
    _, first, row_prompt = np.unique(prompts.numpy(), axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)  # the prompts in the order of their first rows
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return paddle.to_tensor(first[order], dtype="int64"), paddle.to_tensor(rank[row_prompt.reshape(-1)], dtype="int64")


def shared_prompt_groups(exp):
    """prompt_groups(exp) where some of its rows share a prompt, else None."""
    groups = prompt_groups(exp)
    return groups if len(groups[0]) < exp.input_ids.shape[0] else None
