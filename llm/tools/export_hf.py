"""Write a saved policy in Hugging Face's layout, for transformers, vLLM and the hub.

    python llm/tools/export_hf.py --model_name_or_path checkpoints/grpo/policy --output_dir exported/
    python llm/tools/export_hf.py --model_name_or_path BASE --lora_path checkpoints/grpo/policy --output_dir exported/

Any folder the trainer writes serves (a run's output_dir/policy, a checkpoint-N/policy, a folder in either
layout); a LoRA run's adapters are given as `--lora_path` over their base model and folded into the
weights. The folder gets model.safetensors (shards with an index past 5 GB), config.json,
generation_config.json and the tokenizer: what `--export_hf true` writes at the end of a run.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.models.hf_layout import SHARD_BYTES, save_hf_folder  # noqa: E402
from paddle_alignment.models.loading import load_policy  # noqa: E402
from paddle_alignment.models.lora_utils import is_adapters_folder  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")


def export_hf(model_name_or_path, output_dir, lora_path=None, dtype=None, shard_bytes=SHARD_BYTES):
    if is_adapters_folder(model_name_or_path):
        raise ValueError(f"{model_name_or_path} holds LoRA adapters only: give their base model as --model_name_or_path and this folder as --lora_path")
    if lora_path and not is_adapters_folder(lora_path):
        raise ValueError(f"--lora_path {lora_path}: not a folder of LoRA adapters")
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise FileExistsError(f"--output_dir {output_dir} is not empty; export into a new folder")
    model, tokenizer = load_policy(model_name_or_path, lora_path, dtype)
    save_hf_folder(model, output_dir, tokenizer, shard_bytes=shard_bytes)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", required=True, help="A saved policy (or the base model of --lora_path).")
    parser.add_argument("--output_dir", required=True, help="New folder for the Hugging Face-layout model.")
    parser.add_argument("--lora_path", default=None, help="LoRA adapters (a LoRA run's policy folder) to fold in.")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="Weights dtype of the export (default: as saved).")
    parser.add_argument("--shard_bytes", type=int, default=SHARD_BYTES, help="Largest safetensors file.")
    args = parser.parse_args(argv)
    export_hf(args.model_name_or_path, args.output_dir, args.lora_path, args.dtype, args.shard_bytes)
    print(f"{args.model_name_or_path} written in Hugging Face's layout to {args.output_dir}")


if __name__ == "__main__":
    main()
