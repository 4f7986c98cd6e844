import json
import os
import shutil
import subprocess

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import LlamaConfig, Qwen2Config

from helpers import REPO_ROOT, built_paddlenlp_ops, transformers_python
from paddle_alignment.models.fused_kernels import FUSED_OPS, PATCHED, use_fused_kernels
from paddle_alignment.models.checkpoint_config import read_config
from paddle_alignment.models.hf_layout import save_hf_weights
from paddle_alignment.models.loading import pretrained_causal_lm
from paddle_alignment.models.rope import canonical_rope, inverse_frequencies, rope_settings

# Folders and logits written by transformers 5 (tests/data/transformers5/make_folders.py).
FOLDERS = os.path.join(REPO_ROOT, "tests", "data", "transformers5")
INPUTS = json.load(open(os.path.join(FOLDERS, "inputs.json")))
CASES = {
    "qwen2_default": "qwen2", "qwen2_yarn": "qwen2", "qwen2_yarn_v4": "qwen2", "llama3_1": "llama",
    "llama3_1_v4": "llama", "llama_linear": "llama", "llama_dynamic": "llama", "qwen3_default": "qwen3",
    "ernie4_5_default": "ernie4_5", "qwen2_moe_default": "qwen2_moe", "qwen3_moe_default": "qwen3_moe",
}


def case_folder(tmp_path, case):
    """The case's folder as its writer left it: the family's weights under the case's config.json."""
    folder = tmp_path / case
    shutil.copytree(os.path.join(FOLDERS, CASES[case]), folder)
    shutil.copy(os.path.join(FOLDERS, case, "config.json"), folder / "config.json")
    return str(folder)


def logits(model):
    ids, positions = (paddle.to_tensor(INPUTS[key]) for key in ("input_ids", "position_ids"))
    with paddle.no_grad():
        return model(ids, position_ids=positions)[0].numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_transformers_folder_gives_transformers_logits_in_either_layout(tmp_path, case):
    expected = np.load(os.path.join(FOLDERS, case, "logits.npy"))
    model = pretrained_causal_lm(case_folder(tmp_path, case))
    np.testing.assert_allclose(logits(model), expected, atol=1e-4, rtol=0)
    # Saved by paddlenlp (the run's checkpoints), the RoPE settings come back in one spelling, and the same logits.
    model.save_pretrained(str(tmp_path / "paddle"))
    saved = json.load(open(tmp_path / "paddle" / "config.json"))
    assert "rope_parameters" not in saved and saved["rope_theta"] == model.config.rope_theta
    reloaded = pretrained_causal_lm(str(tmp_path / "paddle"))
    np.testing.assert_allclose(logits(reloaded), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["qwen3_default", "ernie4_5_default"])
def test_the_fused_cpu_kernels_reach_the_project_s_own_attention_layers_unchanged(tmp_path, case):
    built_paddlenlp_ops(FUSED_OPS)
    model = pretrained_causal_lm(case_folder(tmp_path, case))
    assert use_fused_kernels(model) > 0 and all(getattr(layer.self_attn, PATCHED, False) for layer in model.base_model.layers)
    np.testing.assert_allclose(logits(model), np.load(os.path.join(FOLDERS, case, "logits.npy")), atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_continuations_equal_transformers(tmp_path, case):
    expected = json.load(open(os.path.join(FOLDERS, case, "greedy.json")))
    model = pretrained_causal_lm(case_folder(tmp_path, case)).eval()
    ids = paddle.to_tensor(INPUTS["input_ids"])
    never = model.config.vocab_size  # transformers' folders here name no end token: it never stops early
    tokens = model.generate(ids, attention_mask=paddle.ones_like(ids), max_new_tokens=len(expected[0]),
                            decode_strategy="greedy_search", eos_token_id=never, pad_token_id=0)[0]
    assert tokens.numpy().tolist() == expected


def test_the_rope_settings_read_alike_from_each_spelling():
    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}
    v5 = Qwen2Config(rope_parameters=dict(yarn))
    v4 = Qwen2Config(rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert rope_settings(v5) == rope_settings(v4) == yarn
    assert rope_settings(Qwen2Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6})) == {"rope_type": "default", "rope_theta": 1e6}
    paddlenlp = LlamaConfig(rope_theta=1e4, rope_scaling_type="dynamic_ntk", rope_scaling_factor=2.0)
    assert rope_settings(paddlenlp) == {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    canonical_rope(v5)
    assert (v5.rope_theta, v5.rope_scaling, hasattr(v5, "rope_parameters")) == (1e6, {k: v for k, v in yarn.items() if k != "rope_theta"}, False)
    # llama3 and yarn take their original context from max_position_embeddings when the block omits it.
    assert rope_settings(LlamaConfig(max_position_embeddings=4096, rope_scaling={"rope_type": "yarn", "factor": 2.0}))["original_max_position_embeddings"] == 4096


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "'longrope' is not supported"),
        ({"rope_scaling": {"type": "linear"}}, "needs ['factor']"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "mrope_section": [2, 2]}}, "['mrope_section']"),
        ({"rope_scaling_type": "ntk", "rope_scaling_factor": 2.0}, "rope_scaling_type 'ntk'"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ],
)
def test_a_rope_setting_that_cannot_be_honoured_is_refused_naming_it(fields, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("(", r"\(")):
        rope_settings(LlamaConfig(**fields))


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"head_dim": 32}, "head_dim 32 differs"),
        ({"attention_bias": True}, "attention_bias true"),
        ({"mlp_bias": True}, "mlp_bias true"),
        ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 64}, r"sliding-window attention \(window 64 on layers \[1\]\)"),
        ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types \\['chunked_attention'\\]"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "config.json: rope_parameters: RoPE type 'longrope'"),
        ({"model_type": "mistral"}, r"config.json: model_type 'mistral' is not supported; supported: \['ernie4_5', 'llama', 'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe'\]"),
    ],
)
def test_a_folder_whose_math_the_models_lack_stops_at_load_naming_the_field(tmp_path, fields, named):
    folder = case_folder(tmp_path, "llama3_1")
    config = json.load(open(os.path.join(folder, "config.json")))
    config.pop("rope_parameters")
    json.dump({**config, **fields}, open(os.path.join(folder, "config.json"), "w"))
    with pytest.raises(ValueError, match=named):
        read_config(folder, {})
    with pytest.raises(ValueError, match=named):
        pretrained_causal_lm(folder)


def test_sliding_window_attention_that_no_sequence_reaches_loads():
    # Qwen2's transformers 4 rule: layers from max_window_layers on slide once use_sliding_window is set.
    from paddle_alignment.models.checkpoint_config import refuse_unsupported, sliding_layers

    config = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, max_window_layers=2, sliding_window=32768, max_position_embeddings=32768)
    assert sliding_layers(config) == [2, 3]
    refuse_unsupported(config)
    config.sliding_window = 4096
    with pytest.raises(ValueError, match=r"window 4096 on layers \[2, 3\]"):
        refuse_unsupported(config)


def test_dynamic_rope_is_plain_rope_within_its_context_and_refused_past_it(tmp_path):
    settings = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
    np.testing.assert_array_equal(inverse_frequencies(settings, 16, 64)[0], inverse_frequencies({"rope_type": "default", "rope_theta": 1e4}, 16, 64)[0])
    folder = case_folder(tmp_path, "llama_dynamic")
    config = json.load(open(os.path.join(folder, "config.json")))
    json.dump({**config, "max_position_embeddings": 16}, open(os.path.join(folder, "config.json"), "w"))
    model = pretrained_causal_lm(folder)
    model(paddle.to_tensor([list(range(16))]))
    with pytest.raises(ValueError, match="dynamic RoPE beyond max_position_embeddings \\(16\\)"):
        model(paddle.to_tensor([list(range(17))]))


def test_every_layer_of_a_model_reads_one_table():
    model = pretrained_causal_lm(os.path.join(FOLDERS, "qwen2"))
    tables = {id(layer.self_attn.rotary_emb.tables) for layer in model.qwen2.layers}
    assert len(tables) == 1


@pytest.mark.parametrize("case", ["qwen2_yarn", "llama3_1", "qwen3_default", "ernie4_5_default", "qwen2_moe_default", "qwen3_moe_default"])
def test_an_exported_folder_keeps_the_rope_settings_for_us_and_for_transformers(tmp_path, case):
    expected = np.load(os.path.join(FOLDERS, case, "logits.npy"))
    exported = str(tmp_path / "exported")
    save_hf_weights(pretrained_causal_lm(case_folder(tmp_path, case)), exported)
    np.testing.assert_allclose(logits(pretrained_causal_lm(exported)), expected, atol=1e-4, rtol=0)
    if transformers_python() is None:
        pytest.skip("transformers is not installed (set TRANSFORMERS_PYTHON to a Python that has it)")
    script = (
        "import sys, json, numpy, torch, transformers\n"
        "inputs = json.load(open(sys.argv[2]))\n"
        "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()\n"
        "with torch.no_grad(): numpy.save(sys.argv[3], m(torch.tensor(inputs['input_ids']), position_ids=torch.tensor(inputs['position_ids'])).logits.numpy())\n"
    )
    subprocess.run([transformers_python(), "-c", script, exported, os.path.join(FOLDERS, "inputs.json"), str(tmp_path / "hf.npy")], check=True)
    np.testing.assert_allclose(np.load(tmp_path / "hf.npy"), expected, atol=1e-4, rtol=0)
