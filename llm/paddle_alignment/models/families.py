"""The model families the loaders take, by the names a config.json gives them.

paddlenlp's Auto classes find a config and model class by `model_type` and `architectures`; for the families it
lacks (Qwen3 and Qwen3-MoE, ERNIE 4.5) or computes otherwise than the model (Qwen2-MoE's routing), these tables name the
project's classes, and every loader asks them first (checkpoint_config.read_config, loading.causal_lm_class);
score_model.py has their score models.
"""

from paddle_alignment.models import ernie4_5, qwen2_moe
from paddle_alignment.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

# model_type -> config class
CONFIG_CLASSES = {"qwen3": Qwen3Config, "qwen3_moe": Qwen3MoeConfig, "ernie4_5": ernie4_5.Ernie4_5Config}
# architecture -> causal LM class
CAUSAL_LM_CLASSES = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM, "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    **dict.fromkeys(ernie4_5.ARCHITECTURES, ernie4_5.Ernie4_5ForCausalLM),
    "Qwen2MoeForCausalLM": qwen2_moe.Qwen2MoeForCausalLM,  # paddlenlp's config, its sparse block replaced
}
# Every model type the loaders take: paddlenlp's Qwen2 and Llama, and the project's own.
MODEL_TYPES = frozenset({"qwen2", "llama", "qwen2_moe", *CONFIG_CLASSES})
# The model types whose classes read `head_dim` from the config; paddlenlp's take hidden_size / num_attention_heads.
OWN_HEAD_DIM = frozenset(CONFIG_CLASSES)
