"""Build a randomly initialised model with a real model's architecture, by name, and its tokenizer.

    python llm/tools/build_real_model.py --name qwen2.5-0.5b --num_layers 2 --output_dir real/qwen-2l

The configuration is the real one (Qwen2.5-0.5B: hidden 896, 14 heads, 2 KV heads, intermediate 4,864,
vocabulary 151,936, tied embeddings, rope theta 1e6; also Qwen2.5-7B, Qwen3-0.6B and -8B, Llama 3.2-1B and 3.1-8B), `--num_layers` cuts it to fewer layers (2 layers:
166M parameters, small enough for tests), and the tokenizer is build_real_tokenizer.py's for the family:
byte-level, the real special tokens at their real ids, covering the whole vocabulary. The folder is
written as the Hugging Face hub ships an Instruct model (`--layout hf`: model.safetensors in PyTorch's
layout, sharded with an index past `--shard_bytes`, config.json, generation_config.json, tokenizer.json,
tokenizer_config.json with the chat template) or with paddlenlp's save_pretrained (`--layout paddle`).
Nothing here is downloaded; the weights are random (seeded).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import paddle  # noqa: E402
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from llm.tools.build_real_tokenizer import build_real_tokenizer  # noqa: E402
from paddle_alignment.models.hf_layout import SHARD_BYTES, generation_config, save_hf_weights, write_json  # noqa: E402
from paddle_alignment.models.loading import pretrained_tokenizer  # noqa: E402
from paddle_alignment.models.qwen3 import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

QWEN2_5 = {
    "family": "qwen2", "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
    "attention_dropout": 0.0, "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151645,
    "vocab_size": 151936,
}
QWEN3 = {**QWEN2_5, "family": "qwen3", "head_dim": 128, "max_position_embeddings": 40960, "attention_bias": False}
LLAMA3_ROPE = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}
LLAMA3 = {
    "family": "llama", "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-5, "rope_theta": 5e5,
    "attention_dropout": 0.0, "max_position_embeddings": 131072, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "vocab_size": 128256,
}
ARCHITECTURES = {
    "qwen2.5-0.5b": {
        **QWEN2_5, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "sliding_window": 32768, "max_window_layers": 21,
        "tie_word_embeddings": True,
    },
    "qwen2.5-7b": {
        **QWEN2_5, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "max_position_embeddings": 32768, "sliding_window": 131072, "max_window_layers": 28,
        "tie_word_embeddings": False, "vocab_size": 152064,
    },
    "qwen3-0.6b": {
        **QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        **QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "tie_word_embeddings": False,
    },
    "llama-3.2-1b": {
        **LLAMA3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "tie_word_embeddings": True, "rope_scaling": LLAMA3_ROPE,
    },
    "llama-3.1-8b": {
        **LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "tie_word_embeddings": False, "rope_scaling": {**LLAMA3_ROPE, "factor": 8.0},
    },
}
MODELS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
          "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
LAYOUTS = ("hf", "paddle")


def real_config(name, num_layers=None):
    """(family, paddlenlp config) of the architecture `name`, cut to `num_layers` layers when given."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {sorted(ARCHITECTURES)}")
    fields = dict(ARCHITECTURES[name])
    family = fields.pop("family")
    if num_layers is not None:
        if not 0 < num_layers <= fields["num_hidden_layers"]:
            raise ValueError(f"num_layers must be in 1..{fields['num_hidden_layers']} for {name}, got {num_layers}")
        fields["num_hidden_layers"] = num_layers
        if "max_window_layers" in fields:
            fields["max_window_layers"] = min(fields["max_window_layers"], num_layers)
    config_class, model_class = MODELS[family]
    return family, config_class(architectures=[model_class.__name__], **fields)


def build_real_model(name, output_dir, num_layers=None, layout="hf", dtype="bfloat16", seed=0, shard_bytes=SHARD_BYTES):
    """Write the model `name` (random, `seed`) and its tokenizer to `output_dir`; returns the model."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    family, config = real_config(name, num_layers)
    build_real_tokenizer(output_dir, family, config.vocab_size)
    tokenizer = pretrained_tokenizer(output_dir)
    paddle.seed(seed)
    model = MODELS[family][1]._from_config(config, dtype=dtype)
    model.eval()
    if layout == "hf":
        save_hf_weights(model, output_dir, shard_bytes=shard_bytes)
    else:
        model.save_pretrained(output_dir)
    # The Instruct models' generation settings, as the hub ships them.
    sampling = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    generation = generation_config(tokenizer, config)
    if isinstance(config.eos_token_id, list):  # Llama 3's Instruct models end at each of these
        generation["eos_token_id"] = config.eos_token_id
    write_json({**generation, **sampling}, os.path.join(output_dir, "generation_config.json"))
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, choices=sorted(ARCHITECTURES))
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_layers", type=int, default=None, help="Fewer layers than the real model (2 for tests).")
    parser.add_argument("--layout", choices=LAYOUTS, default="hf")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--shard_bytes", type=int, default=SHARD_BYTES, help="Largest safetensors shard (hf layout).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = build_real_model(args.name, args.output_dir, args.num_layers, args.layout, args.dtype, args.seed, args.shard_bytes)
    n_params = sum(int(p.numel()) for p in model.parameters())
    print(json.dumps({"name": args.name, "layers": model.config.num_hidden_layers, "parameters": n_params, "layout": args.layout, "output_dir": args.output_dir}))


if __name__ == "__main__":
    main()
