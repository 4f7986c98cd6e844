from types import SimpleNamespace

import pytest

from paddle_alignment.models.loading import load_dtype


@pytest.mark.parametrize(
    "bf16, fp16, level, trained, frozen",
    [
        (False, False, "O1", "float32", "float32"),  # the CPU configs
        (True, False, "O1", "float32", "bfloat16"),  # the GPU configs: float32 master weights, half-precision frozen models
        (True, False, "O2", "bfloat16", "bfloat16"),
        (False, True, "O1", "float32", "float16"),
        (False, True, "O2", "float16", "float16"),
    ],
)
def test_trained_weights_stay_float32_unless_o2_and_frozen_models_follow_the_autocast(bf16, fp16, level, trained, frozen):
    # Never the checkpoint's dtype: a downloaded Qwen2.5's config.json says bfloat16.
    args = SimpleNamespace(bf16=bf16, fp16=fp16, fp16_opt_level=level)
    assert (load_dtype(args, trains=True), load_dtype(args, trains=False)) == (trained, frozen)
