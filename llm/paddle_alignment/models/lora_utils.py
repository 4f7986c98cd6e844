"""LoRA actors (paddlenlp.peft): the reference policy is the base model, reached by switching the adapters
off rather than holding a second copy, and a merged copy can be saved for inference."""

import contextlib
import os

from paddlenlp.peft import LoRAModel
from paddlenlp.utils.env import LORA_CONFIG_NAME


def is_adapters_folder(path):
    """Whether `path` holds LoRA adapters (a LoRA run's output_dir/policy: no model weights of its own)."""
    return os.path.isfile(os.path.join(path, LORA_CONFIG_NAME))


def is_lora(model):
    return isinstance(model, LoRAModel)


@contextlib.contextmanager
def adapters_disabled(model):
    """`model` (a LoRAModel) computes with its base weights only inside the block."""
    model.disable_lora()
    try:
        yield model
    finally:
        model.enable_lora()


def merged_state_dict(model):
    """The base model's weights with every adapter folded in (W + A B x alpha / r) and no adapter tensors:
    what `AutoModelForCausalLM.from_pretrained` loads."""
    base = model.model
    state = {key: value for key, value in base.state_dict().items() if "lora_" not in key}
    for name, layer in base.named_sublayers():
        if hasattr(layer, "get_delta_weight") and not layer.merged:
            state[f"{name}.weight"] = layer.weight + layer.get_delta_weight()
    return state

