"""Rotary position embeddings as transformers computes them, for every RoPE type the Qwen2 and Llama families use.

A folder states its RoPE three ways: transformers 5 writes `rope_parameters` (`{"rope_type", "rope_theta",
...}`), transformers 4 a top-level `rope_theta` and a `rope_scaling` dict (its type under `type` or
`rope_type`), paddlenlp `rope_scaling_type` and `rope_scaling_factor`. paddlenlp's Qwen2 reads only
`rope_theta` and its Llama only the llama3 type, so any other setting would run as plain RoPE: wrong logits
with no error. `rope_settings` reads all three spellings into one dict (transformers 5's), `canonical_rope`
writes it back as transformers 4's keys (which paddlenlp, this project's export and transformers 5 all read),
and `use_rope_tables` gives every attention layer of a model tables computed from it by ports of
transformers' `modeling_rope_utils` (float32, in its order of operations). A type or field this module
cannot honour is an error naming it.
"""

import math

import numpy as np
import paddle
from paddle import nn

DEFAULT_THETA = 10000.0
# paddlenlp's own spellings of `rope_scaling_type`, as transformers' types.
PADDLENLP_TYPES = {"linear": "linear", "dynamic_ntk": "dynamic"}
# The fields each type reads (besides rope_type and rope_theta); any other field is refused.
TYPE_FIELDS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
}
REQUIRED_FIELDS = {"linear": ("factor",), "dynamic": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}
ROPE_FIELDS = ("rope_parameters", "rope_scaling", "rope_theta", "rope_scaling_type", "rope_scaling_factor")


def rope_settings(config):
    """The RoPE of `config` (a paddlenlp config read from any folder) as transformers 5 states it:
    {"rope_type", "rope_theta", and the type's own fields}. An unknown type or field is a ValueError naming it."""
    theta = getattr(config, "rope_theta", None)
    parameters = getattr(config, "rope_parameters", None)
    scaling = getattr(config, "rope_scaling", None)
    source = "rope_parameters" if parameters else "rope_scaling"
    settings = dict(parameters or scaling or {})
    if not settings and getattr(config, "rope_scaling_type", None):
        kind = config.rope_scaling_type
        if kind not in PADDLENLP_TYPES:
            raise ValueError(f"rope_scaling_type {kind!r} is not supported; supported: {sorted(PADDLENLP_TYPES)}")
        settings, source = {"rope_type": PADDLENLP_TYPES[kind], "factor": config.rope_scaling_factor}, "rope_scaling_type"
    kind = settings.pop("rope_type", None) or settings.pop("type", None) or "default"
    settings.pop("type", None)
    settings.setdefault("rope_theta", theta if theta is not None else DEFAULT_THETA)
    if kind not in TYPE_FIELDS:
        raise ValueError(f"{source}: RoPE type {kind!r} is not supported; supported: {sorted(TYPE_FIELDS)}")
    rotary_part = settings.pop("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if rotary_part not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor {rotary_part}: RoPE over part of each head is not supported")
    unknown = sorted(set(settings) - TYPE_FIELDS[kind] - {"rope_theta"})
    if unknown:
        raise ValueError(f"{source}: the field(s) {unknown} of RoPE type {kind!r} are not supported")
    missing = [name for name in REQUIRED_FIELDS.get(kind, ()) if settings.get(name) is None]
    if missing:
        raise ValueError(f"{source}: RoPE type {kind!r} needs {missing}")
    if kind in ("yarn", "llama3"):
        settings.setdefault("original_max_position_embeddings",
                            getattr(config, "original_max_position_embeddings", None) or config.max_position_embeddings)
    return {"rope_type": kind, **settings}


def canonical_rope(config):
    """Set `config`'s RoPE as transformers 4 writes it (`rope_theta`, and `rope_scaling` unless the type is the
    default), the one spelling every reader understands, and drop the others so they cannot disagree."""
    settings = rope_settings(config)
    config.rope_theta = float(settings.pop("rope_theta"))
    config.rope_scaling = None if settings["rope_type"] == "default" else settings
    config.rope_scaling_type, config.rope_scaling_factor = None, 1.0
    if hasattr(config, "rope_parameters"):
        del config.rope_parameters


def head_dim(config):
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def inverse_frequencies(settings, dim, max_position_embeddings):
    """(inverse frequencies [dim / 2] float32, attention factor) of the RoPE `settings` (rope_settings'), for
    heads of `dim`: transformers' `_compute_*_parameters`."""
    kind, base = settings["rope_type"], np.float32(settings["rope_theta"])
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv_freq = np.float32(1.0) / base**exponents
    if kind == "linear":
        return inv_freq / np.float32(settings["factor"]), 1.0
    if kind == "llama3":
        return llama3_frequencies(inv_freq, settings), 1.0
    if kind == "yarn":
        return yarn_frequencies(base**exponents, settings, dim, max_position_embeddings)
    return inv_freq, 1.0  # default; dynamic equals it up to max_position_embeddings (RotaryTables refuses beyond)


def llama3_frequencies(inv_freq, settings):
    """Llama 3.1's: long wavelengths divided by `factor`, short ones kept, those between interpolated."""
    factor, low, high = (np.float32(settings[name]) for name in ("factor", "low_freq_factor", "high_freq_factor"))
    old_context = np.float32(settings["original_max_position_embeddings"])
    wavelength = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < old_context / high) & ~(wavelength > old_context / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def yarn_frequencies(position_frequencies, settings, dim, max_position_embeddings):
    """YaRN's: interpolated frequencies ramped into extrapolated ones between the beta_fast and beta_slow
    rotations, and its attention factor (applied to cos and sin)."""
    base, original = float(settings["rope_theta"]), settings["original_max_position_embeddings"]
    factor = settings.get("factor") or max_position_embeddings / original
    attention_factor = settings.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = settings.get("mscale"), settings.get("mscale_all_dim")
        attention_factor = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else yarn_mscale(factor))

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(settings.get("beta_fast") or 32), correction_dim(settings.get("beta_slow") or 1)
    if settings.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation = np.float32(1) - ramp
    interpolated = np.float32(1.0) / (np.float32(factor) * position_frequencies)
    extrapolated = np.float32(1.0) / position_frequencies
    return (interpolated * (1 - extrapolation) + extrapolated * extrapolation).astype(np.float32), float(attention_factor)


def yarn_mscale(scale, mscale=1):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class RopeTables:
    """cos and sin of every position of a model, computed once and shared by its layers. The tables cover at least
    max_position_embeddings positions, as paddlenlp's do: its attention layers ask for the length of the sequence
    but read the rows of its position ids, which may lie past it."""

    def __init__(self, settings, dim, max_position_embeddings):
        self.settings, self.max_position_embeddings = settings, max_position_embeddings
        self.inv_freq, self.attention_factor = inverse_frequencies(settings, dim, max_position_embeddings)
        self.length, self.by_dtype = 0, {}

    def __call__(self, length, dtype):
        """cos and sin of positions [0, max(length, max_position_embeddings)): [1, L, 1, dim] in `dtype`."""
        if self.settings["rope_type"] == "dynamic" and length > self.max_position_embeddings:
            raise ValueError(f"dynamic RoPE beyond max_position_embeddings ({self.max_position_embeddings}) is not "
                             f"supported: {length} positions asked")
        length = max(length, self.max_position_embeddings)
        if length > self.length:
            frequencies = np.arange(length, dtype=np.float32)[:, None] * self.inv_freq[None, :]
            angles = np.concatenate([frequencies, frequencies], axis=-1)
            scale = np.float32(self.attention_factor)
            tables = (paddle.to_tensor((np.cos(angles) * scale)[None, :, None, :]),
                      paddle.to_tensor((np.sin(angles) * scale)[None, :, None, :]))
            self.length, self.by_dtype = length, {tables[0].dtype: tables}
        if dtype not in self.by_dtype:
            self.by_dtype[dtype] = tuple(table.astype(dtype) for table in self.by_dtype[paddle.float32])
        return self.by_dtype[dtype]


class RotaryEmbedding(nn.Layer):
    """An attention layer's `rotary_emb` with paddlenlp's interface (`forward(x, seq_len) -> cos, sin`, each
    [1, L, 1, head_dim] in x's dtype, L at least seq_len), reading tables shared with the model's other layers."""

    def __init__(self, tables):
        super().__init__()
        self.tables = tables

    def forward(self, x, seq_len=None):
        return self.tables(seq_len or 0, x.dtype)

    def get_fused_cos_sin(self, x, seq_len=None):
        return None  # paddlenlp's layers ask for this table on GCU devices only


def use_rope_tables(model):
    """Give every attention layer of `model` (a paddlenlp Qwen2/Llama, causal LM or score model) the RoPE tables
    of its config (canonical_rope's), shared by all layers."""
    config = model.config
    tables = RopeTables(rope_settings(config), head_dim(config), config.max_position_embeddings)
    for layer in model.sublayers():
        if hasattr(layer, "rotary_emb") and hasattr(layer, "q_proj"):
            layer.rotary_emb = RotaryEmbedding(tables)
    return model
