"""LoRA actors (paddlenlp.peft): the reference policy is the base model, reached by switching the adapters
off rather than holding a second copy, and a merged copy can be saved for inference."""

import contextlib

from paddlenlp.peft import LoRAModel


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


def save_merged(model, folder):
    model.model.save_pretrained(folder, state_dict=merged_state_dict(model))
