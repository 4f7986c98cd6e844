from types import SimpleNamespace

import pytest

from paddle_alignment.models.loading import load_dtype


@pytest.mark.parametrize(
    "bf16, fp16, level, dtype",
    [
        (False, False, "O1", "float32"),  # the CPU configs
        (True, False, "O1", "float32"),  # the GPU configs: float32 weights under bfloat16 autocast
        (True, False, "O2", "bfloat16"),
        (False, True, "O1", "float32"),
        (False, True, "O2", "float16"),
    ],
)
def test_weights_load_in_float32_unless_o2_asks_for_half_precision(bf16, fp16, level, dtype):
    # Never the checkpoint's dtype: a downloaded Qwen2.5's config.json says bfloat16.
    assert load_dtype(SimpleNamespace(bf16=bf16, fp16=fp16, fp16_opt_level=level)) == dtype
