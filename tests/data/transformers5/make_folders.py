"""Writes the model folders of tests/data/transformers5 with transformers 5 itself, and the logits it computes on
them, for the tests that load such folders here (tests/llm/paddle_alignment/models/test_rope.py, and
tests/llm/test_model_families.py for `pipeline/<family>/`).

    /path/to/a/python/with/transformers5/and/torch tests/data/transformers5/make_folders.py

Each family's weights (random, seeded; 2 layers, heads of 16, or 24 for Qwen3 and ERNIE 4.5) are saved once by `save_pretrained` into
`<family>/`; each case is a config.json as the case's writer spells it (transformers 5's `rope_parameters`, or
the `rope_scaling` block that transformers 4 users paste in) and `logits.npy`: what transformers computes from
the family's weights under that config for INPUT_IDS at POSITIONS, far past the original context where the
case scales it, and `greedy.json`: its greedy continuation of INPUT_IDS.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
INPUT_IDS = [[3, 17, 5, 28, 9, 31, 2, 11], [7, 7, 19, 4, 25, 13, 30, 1]]
POSITIONS = [list(range(8)), list(range(20000, 20008))]
GREEDY_TOKENS = 8  # greedy.json: transformers' greedy continuation of INPUT_IDS (positions from 0)
SHAPE = dict(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1)
FAMILIES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6)),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5)),
    # Heads of 24 where hidden_size / heads is 16: Qwen3's head_dim is a field of its own (128 in every size).
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(tie_word_embeddings=True, max_position_embeddings=40960, rms_norm_eps=1e-6, head_dim=24)),
    # ERNIE 4.5: interleaved RoPE, heads of their own size; biases on every projection (use_bias; none in the
    # released 0.3B, whose path is the same without them).
    "ernie4_5": (transformers.Ernie4_5Config, transformers.Ernie4_5ForCausalLM,
                 dict(tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5, head_dim=24, use_bias=True)),
    # Qwen2-MoE as Qwen2-57B-A14B is laid out: every layer sparse, a shared expert, no renormalised top-k.
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(tie_word_embeddings=False, max_position_embeddings=32768, rms_norm_eps=1e-6, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                       decoder_sparse_step=1, norm_topk_prob=False)),
    # Qwen3-MoE as Qwen3-30B-A3B is laid out: Qwen3's attention, every layer sparse, no shared expert, top-k
    # renormalised.
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(tie_word_embeddings=False, max_position_embeddings=40960, rms_norm_eps=1e-6, head_dim=24,
                       num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1,
                       norm_topk_prob=True)),
}
LLAMA3_1 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# name: (family, the config.json fields of the case; "_v4": spelled as transformers 4 wrote them)
CASES = {
    "qwen2_default": ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen2_yarn": ("qwen2", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                 "original_max_position_embeddings": 32768},
                             "max_position_embeddings": 131072}),
    # Qwen2.5's model card: add this block to a transformers 4 config.json for contexts past 32,768.
    "qwen2_yarn_v4": ("qwen2", {"rope_theta": 1e6, "max_position_embeddings": 131072,
                                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}),
    "qwen3_default": ("qwen3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "ernie4_5_default": ("ernie4_5", {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}),
    "qwen2_moe_default": ("qwen2_moe", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen3_moe_default": ("qwen3_moe", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "llama3_1": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3_1}}),
    "llama3_1_v4": ("llama", {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **LLAMA3_1}}),
    "llama_linear": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}}),
    "llama_dynamic": ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}),
}


# Folders for the stages (tests/llm/test_model_families.py): each family at the tiny world's vocabulary (259 ids),
# 2 layers of 64, in bfloat16 as the hub ships models, as transformers 5 saves it (its own initialisation); the
# tests add the tiny tokenizer.
PIPELINE_SHAPE = dict(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, bos_token_id=256, eos_token_id=258, pad_token_id=256)
PIPELINE_FIELDS = {
    "qwen2": dict(tie_word_embeddings=True),
    "llama": dict(tie_word_embeddings=False),
    "qwen3": dict(tie_word_embeddings=True, head_dim=32),
    "ernie4_5": dict(tie_word_embeddings=True, head_dim=32),
    "qwen2_moe": dict(tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=128, decoder_sparse_step=1),
    "qwen3_moe": dict(tie_word_embeddings=False, head_dim=32, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=64, decoder_sparse_step=1),
}


def save_pipeline_family(name):
    config_class, model_class, _ = FAMILIES[name]
    torch.manual_seed(0)
    folder = os.path.join(HERE, "pipeline", name)
    shutil.rmtree(folder, ignore_errors=True)
    model_class(config_class(**PIPELINE_SHAPE, **PIPELINE_FIELDS[name])).to(torch.bfloat16).save_pretrained(folder)


def save_family(name):
    config_class, model_class, fields = FAMILIES[name]
    torch.manual_seed(0)
    model = model_class(config_class(**SHAPE, **fields))
    with torch.no_grad():  # weights far from the initialiser's near-zero, so positions matter to the logits
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    folder = os.path.join(HERE, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)


def save_case(name, family, fields):
    """The case's config.json (the family's, with `fields` instead of its RoPE fields) and transformers' logits."""
    config = json.load(open(os.path.join(HERE, family, "config.json")))
    for key in ("rope_parameters", "rope_theta", "rope_scaling"):
        config.pop(key, None)
    config.update(fields)
    case = os.path.join(HERE, name)
    os.makedirs(case, exist_ok=True)
    with open(os.path.join(case, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(os.path.join(HERE, family, "model.safetensors"), folder)
        shutil.copy(os.path.join(case, "config.json"), folder)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(torch.tensor(INPUT_IDS), position_ids=torch.tensor(POSITIONS)).logits
        greedy = model.generate(torch.tensor(INPUT_IDS), max_new_tokens=GREEDY_TOKENS, do_sample=False)[:, len(INPUT_IDS[0]):]
    np.save(os.path.join(case, "logits.npy"), logits.numpy())
    with open(os.path.join(case, "greedy.json"), "w") as f:
        json.dump(greedy.tolist(), f)
        f.write("\n")


if __name__ == "__main__":
    assert transformers.__version__.startswith("5."), transformers.__version__
    for family in FAMILIES:
        save_family(family)
    for case, (family, fields) in CASES.items():
        save_case(case, family, fields)
    for family in PIPELINE_FIELDS:
        save_pipeline_family(family)
    with open(os.path.join(HERE, "inputs.json"), "w") as f:
        json.dump({"input_ids": INPUT_IDS, "position_ids": POSITIONS, "transformers": transformers.__version__}, f)
        f.write("\n")
