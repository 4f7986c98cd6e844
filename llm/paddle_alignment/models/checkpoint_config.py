"""A model folder's config.json, read the same way for every layout and loader, as transformers 4 and 5 and
paddlenlp write it.

paddlenlp builds its Qwen2 and Llama from the fields it knows and keeps any other field as an unused
attribute: a field that changes the model's math and that paddlenlp does not implement would give wrong
logits with no error. `read_config` puts the RoPE settings into the one spelling every reader honours
(models/rope.py) and refuses, naming the field, what the models here cannot compute: heads whose size is not
hidden_size / num_attention_heads, Llama's attention and MLP biases, sliding-window attention that a sequence
could reach.
"""

import json
import os
from contextlib import contextmanager

from paddlenlp.transformers import AutoConfig

from paddle_alignment.models.families import CONFIG_CLASSES, MODEL_TYPES, OWN_HEAD_DIM
from paddle_alignment.models.rope import canonical_rope, use_rope_tables


def read_config(folder, options):
    """(config, model keyword arguments) of `folder` as paddlenlp's from_pretrained makes them from `options`:
    the config's own attributes set on it, the others left for the model's constructor; `dtype` (else the
    folder's own, else float32) on the config. A field the models cannot honour is a ValueError naming it."""
    options = dict(options)
    dtype = options.pop("dtype", None)
    config, model_kwargs = config_class(folder).from_pretrained(folder, return_unused_kwargs=True, **options)
    try:
        canonical_rope(config)
        refuse_unsupported(config)
    except ValueError as error:
        raise ValueError(f"{folder}/config.json: {error}") from None
    config.dtype = dtype or config.dtype or "float32"
    return config, model_kwargs


def config_class(folder):
    """The project's config class for the folder's model_type where paddlenlp has none (models/families.py), else
    paddlenlp's AutoConfig. A model_type outside the families the models here cover is a ValueError naming it."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return AutoConfig
    with open(path, encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{path}: model_type {model_type!r} is not supported; supported: {sorted(MODEL_TYPES)} "
                         "(the README's model families)")
    return CONFIG_CLASSES.get(model_type, AutoConfig)


SCORE_HEAD = "score_head"


def fresh_parts(model):
    """Name prefixes of the parameters a folder may lack: a score model's head and normalizer, which a causal LM's
    folder gives no tensor (they start fresh)."""
    return (f"{SCORE_HEAD}.", "normalizer.") if hasattr(model, SCORE_HEAD) else ()


def from_paddle_folder(folder, class_for_config, options):
    """The model `class_for_config(config)` of a Paddle-layout `folder` by paddlenlp's loader, its config read by
    read_config and its RoPE tables as transformers computes them. A parameter the folder has no tensor for is a
    ValueError naming it, where paddlenlp would initialise it at random and warn (one of another shape it refuses
    itself)."""
    config, model_kwargs = read_config(folder, options)
    model_class = class_for_config(config)
    with every_weight_loaded(model_class, folder):
        model = model_class.from_pretrained(folder, config=config, **model_kwargs)
    return use_rope_tables(model)


@contextmanager
def every_weight_loaded(model_class, folder):
    """paddlenlp's `_load_pretrained_model` of `model_class`, meanwhile raising when it leaves a parameter
    unloaded but for a score model's fresh parts."""
    load = model_class._load_pretrained_model.__func__
    inherited = "_load_pretrained_model" not in model_class.__dict__

    def checked(cls, *args, **kwargs):
        model, missing, unexpected, mismatched = load(cls, *args, **kwargs)
        unloaded = [name for name in missing if not name.startswith(fresh_parts(model))]
        if unloaded:
            raise ValueError(f"{folder} has no tensor for {unloaded[:8]}{' ...' if len(unloaded) > 8 else ''} "
                             f"({len(unloaded)} in all) of {model_class.__name__}: a checkpoint of another model, or "
                             "with other parameter names")
        return model, missing, unexpected, mismatched

    model_class._load_pretrained_model = classmethod(checked)
    try:
        yield
    finally:
        if inherited:
            del model_class._load_pretrained_model
        else:
            model_class._load_pretrained_model = classmethod(load)


def refuse_unsupported(config):
    """A ValueError naming the first field of `config` that changes the math in a way the models here lack."""
    heads = config.hidden_size // config.num_attention_heads
    if config.model_type not in OWN_HEAD_DIM and getattr(config, "head_dim", None) not in (None, heads):
        raise ValueError(f"head_dim {config.head_dim} differs from hidden_size / num_attention_heads ({heads}), "
                         f"which the {config.model_type} models here use")
    for field in ("attention_bias", "mlp_bias"):
        if config.model_type == "llama" and getattr(config, field, False):
            raise ValueError(f"{field} true: the Llama model here has no such biases")
    if config.model_type in ("qwen2_moe", "qwen3_moe"):
        refuse_unsupported_moe(config)
    window, sliding = getattr(config, "sliding_window", None), sliding_layers(config)
    if sliding and (window is None or window < config.max_position_embeddings):
        raise ValueError(f"layer_types / use_sliding_window: sliding-window attention (window {window} on layers "
                         f"{sliding}) is not supported; only full attention is")


def refuse_unsupported_moe(config):
    """The Qwen2-MoE and Qwen3-MoE here (models/qwen2_moe.py, qwen3.py) have sparse layers only and no router loss,
    and Qwen2-MoE q/k/v biases and an LM head of its own, as every released size does."""
    if getattr(config, "decoder_sparse_step", 1) != 1 or getattr(config, "mlp_only_layers", None):
        raise ValueError(f"decoder_sparse_step {config.decoder_sparse_step} / mlp_only_layers "
                         f"{config.mlp_only_layers}: dense layers between the sparse ones are not supported")
    if getattr(config, "output_router_logits", False):
        raise ValueError("output_router_logits true: the router's load-balancing loss is not computed here")
    if config.model_type == "qwen3_moe":
        return
    if config.tie_word_embeddings:
        raise ValueError("tie_word_embeddings true: the Qwen2-MoE here has an LM head of its own")
    if not getattr(config, "qkv_bias", True):
        raise ValueError("qkv_bias false: the Qwen2-MoE here has q/k/v biases")


def sliding_layers(config):
    """The layers `config` gives sliding-window attention: its `layer_types` (transformers 5), else the layers
    from max_window_layers on when use_sliding_window is set (Qwen2's rule in transformers 4)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"layer_types {unknown} are not supported; only full_attention and sliding_attention are")
        return [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    if not getattr(config, "use_sliding_window", False):
        return []
    return list(range(getattr(config, "max_window_layers", 0), config.num_hidden_layers))
