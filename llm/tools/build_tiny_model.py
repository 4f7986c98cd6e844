"""Build a tiny randomly initialised Qwen2 causal LM and save it with `save_pretrained`.

The result loads with `AutoModelForCausalLM.from_pretrained(output_dir)`, the same code path as a real
Qwen2.5 checkpoint; the tokenizer is saved beside it so the folder is a complete model.
"""

import argparse

import paddle
from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

from paddle_alignment.models.loading import pretrained_tokenizer


def build_tiny_model(tokenizer_dir, output_dir, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, seed=0):
    """Random-init a Qwen2 sized for CPU demos (about 1M parameters at the defaults) and save it."""
    tokenizer = pretrained_tokenizer(tokenizer_dir)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    paddle.seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--num_kv_heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = build_tiny_model(
        args.tokenizer_dir, args.output_dir, args.hidden_size, args.num_layers, args.num_heads, args.num_kv_heads, args.seed
    )
    n_params = sum(int(p.numel()) for p in model.parameters())
    print(f"tiny Qwen2 with {n_params} parameters written to {args.output_dir}")


if __name__ == "__main__":
    main()
