"""Score models (reward model / critic): a paddlenlp decoder backbone plus a linear score head.

The backbone sits under the PretrainedModel's `base_model_prefix` (`qwen2`, `llama`), the same name a
causal LM uses, so `from_pretrained` on a causal-LM checkpoint loads the backbone and leaves the score
head (and normalizer) freshly initialised. Score settings are stored on the paddlenlp config, so they
round-trip through config.json:

    score_dim (1), score_bias (True), score_type ("reward" | "critic"), do_normalize (False),
    normalizer_type (None = identity | "RunningMeanStd" | "ExponentialMovingAverage"), normalizer_momentum (0.9)

Set them as keyword arguments: `AutoModelForScore.from_pretrained(path, score_type="critic")`.
paddlenlp sets keys the config already has on the config, and passes the others to `__init__`, which
writes them on the config; either way they end up in config.json.
"""

from dataclasses import dataclass
from typing import Optional

import paddle
from paddle import nn
from paddlenlp.transformers import (
    LlamaModel,
    LlamaPretrainedModel,
    Qwen2Model,
    Qwen2PretrainedModel,
)
from paddlenlp.transformers.model_outputs import ModelOutput
from paddlenlp.transformers.qwen2_moe.modeling import Qwen2MoePretrainedModel

from paddle_alignment.algos.token_stats import end_positions, position_ids_from_mask
from paddle_alignment.models.checkpoint_config import from_paddle_folder
from paddle_alignment.models.ernie4_5 import Ernie4_5Config, Ernie4_5Model
from paddle_alignment.models.qwen2_moe import Qwen2MoeModel
from paddle_alignment.models.qwen3 import Qwen3Config, Qwen3Model, Qwen3MoeConfig, Qwen3MoeModel
from paddle_alignment.models.score_model_utils import IdentityNormalizer, build_normalizer

SCORE_CONFIG_DEFAULTS = {
    "score_dim": 1,
    "score_bias": True,
    "score_type": "reward",
    "do_normalize": False,
    "normalizer_type": None,
    "normalizer_momentum": 0.9,
}
SCORE_TYPES = ("reward", "critic")


def refuse_sequence_parallel(config):
    """Score heads (reward model, critic, value pipe) read every position's hidden state, which sequence
    parallel splits over ranks."""
    if getattr(config, "sequence_parallel", False):
        raise ValueError("sequence_parallel splits positions over ranks, but a score head reads every position: load score models without it")


def apply_score_config(config, **overrides):
    """Write the score settings on `config`: `overrides` first, then values it already has, then defaults."""
    unknown = sorted(set(overrides) - set(SCORE_CONFIG_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown score model arguments {unknown}; expected some of {sorted(SCORE_CONFIG_DEFAULTS)}")
    for key, default in SCORE_CONFIG_DEFAULTS.items():
        if key in overrides:
            setattr(config, key, overrides[key])
        elif not hasattr(config, key):
            setattr(config, key, default)
    if config.score_type not in SCORE_TYPES:
        raise ValueError(f"score_type must be one of {SCORE_TYPES}, got {config.score_type!r}")
    return config


@dataclass
class ScoreModelOutput(ModelOutput):
    """scores [B, L, score_dim] per token; end_scores [B, score_dim] at each row's last unmasked token."""

    scores: Optional[paddle.Tensor] = None
    end_scores: Optional[paddle.Tensor] = None


class ScoreModelMixin:
    """Backbone + score head + normalizer. A subclass names only its `backbone_class` and PretrainedModel.

    The subclass's `__init__` is this one; paddlenlp's metaclass does not hook weight initialisation
    onto an inherited `__init__`, hence the explicit `init_weights()` (a no-op under `no_init_weights`).
    """

    backbone_class = None

    def __init__(self, config, **overrides):
        super().__init__(config)
        refuse_sequence_parallel(config)
        apply_score_config(config, **overrides)
        setattr(self, self.base_model_prefix, self.backbone_class(config))
        self.score_head = nn.Linear(config.hidden_size, config.score_dim, bias_attr=config.score_bias)
        self.normalizer = build_normalizer(config.normalizer_type, config.score_dim, config.normalizer_momentum)
        self.init_weights()

    @property
    def backbone(self):
        return getattr(self, self.base_model_prefix)

    def forward(self, input_ids, attention_mask=None, position_ids=None, return_dict=True):
        """input_ids, attention_mask, position_ids: [B, L]. Returns ScoreModelOutput (float32 scores).

        Without position_ids they count unmasked tokens, so left-padded rows start at position 0.
        In training mode a non-identity normalizer is updated with the end scores (a collective under
        data parallel: every rank must run the forward); with `do_normalize` both outputs are normalized
        with the statistics including this batch.
        """
        if position_ids is None and attention_mask is not None:
            position_ids = position_ids_from_mask(attention_mask)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True
        )[0]
        scores = self.score_head(hidden).astype("float32")  # [B, L, D]
        if attention_mask is None:
            end_scores = scores[:, -1]
        else:
            end_scores = scores[paddle.arange(scores.shape[0]), end_positions(attention_mask)]  # [B, D]

        if self.training and not isinstance(self.normalizer, IdentityNormalizer):
            self.normalizer.update(end_scores.detach())
        if self.config.do_normalize:
            scores = self.normalizer.normalize(scores)
            end_scores = self.normalizer.normalize(end_scores)
        if not return_dict:
            return scores, end_scores
        return ScoreModelOutput(scores=scores, end_scores=end_scores)


class Qwen2ForScore(ScoreModelMixin, Qwen2PretrainedModel):
    backbone_class = Qwen2Model


class LlamaForScore(ScoreModelMixin, LlamaPretrainedModel):
    backbone_class = LlamaModel


class Qwen3ForScore(ScoreModelMixin, Qwen2PretrainedModel):
    config_class = Qwen3Config
    backbone_class = Qwen3Model


class Ernie4_5ForScore(ScoreModelMixin, LlamaPretrainedModel):
    config_class = Ernie4_5Config
    backbone_class = Ernie4_5Model


class Qwen2MoeForScore(ScoreModelMixin, Qwen2MoePretrainedModel):
    backbone_class = Qwen2MoeModel


class Qwen3MoeForScore(ScoreModelMixin, Qwen2PretrainedModel):
    config_class = Qwen3MoeConfig
    backbone_class = Qwen3MoeModel


SCORE_MODEL_CLASSES = {
    "qwen2": Qwen2ForScore, "llama": LlamaForScore, "qwen3": Qwen3ForScore, "ernie4_5": Ernie4_5ForScore,
    "qwen2_moe": Qwen2MoeForScore, "qwen3_moe": Qwen3MoeForScore,
}


class AutoModelForScore:
    """Pick the score model class from `config.model_type`; keyword arguments are score settings or
    anything paddlenlp's `from_pretrained` takes (dtype, ...)."""

    @staticmethod
    def class_for(config):
        model_type = getattr(config, "model_type", None)
        if model_type not in SCORE_MODEL_CLASSES:
            raise ValueError(f"no score model for model_type {model_type!r}; supported: {sorted(SCORE_MODEL_CLASSES)}")
        return SCORE_MODEL_CLASSES[model_type]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """A Paddle-layout score model (or a causal LM's folder: its backbone and a fresh head), its config.json
        read as every loader reads it (models/checkpoint_config.py)."""
        return from_paddle_folder(pretrained_model_name_or_path, cls.class_for, kwargs)

    @classmethod
    def from_config(cls, config, **overrides):
        return cls.class_for(config).from_config(config, **overrides)
