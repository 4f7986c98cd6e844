"""Build a tiny randomly initialised causal LM of a model family and save it with its tokenizer.

    python llm/tools/build_tiny_model.py --tokenizer_dir tiny_demo/tokenizer --output_dir tiny_demo/models/tiny-qwen2
    python llm/tools/build_tiny_model.py --family qwen3 --layout hf --tokenizer_dir ... --output_dir ...

The result loads as a real checkpoint of that family does: `--layout paddle` (the default) with paddlenlp's
`save_pretrained`, `--layout hf` as transformers writes it (models/hf_layout.py). Families: qwen2 (the tiny
demo's), llama, qwen3 (heads of their own size, q/k norms), ernie4_5 (heads of their own size, interleaved RoPE), qwen2_moe (4 experts, 2 per token, a shared expert).
"""

import argparse

import paddle
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig

from paddle_alignment.models.ernie4_5 import Ernie4_5Config, Ernie4_5ForCausalLM
from paddle_alignment.models.hf_layout import save_hf_folder
from paddle_alignment.models.loading import pretrained_tokenizer
from paddle_alignment.models.qwen2_moe import Qwen2MoeForCausalLM
from paddle_alignment.models.qwen3 import Qwen3Config, Qwen3ForCausalLM



def wide_heads(hidden_size, num_heads):
    return 2 * hidden_size // num_heads  # heads wider than hidden_size / num_heads, as Qwen3's and ERNIE 4.5's are


# family: (config class, model class, fields beyond the shared ones: a value or a function of (hidden, heads))
FAMILIES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "llama": (LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": False}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"tie_word_embeddings": True, "head_dim": wide_heads}),
    "ernie4_5": (Ernie4_5Config, Ernie4_5ForCausalLM, {"tie_word_embeddings": True, "head_dim": wide_heads}),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, {
        "tie_word_embeddings": False, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": lambda hidden, heads: hidden, "shared_expert_intermediate_size": lambda hidden, heads: 2 * hidden,
    }),
}
LAYOUTS = ("paddle", "hf")


def build_tiny_model(tokenizer_dir, output_dir, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, seed=0,
                     family="qwen2", layout="paddle"):
    """Random-init a model of `family` sized for CPU demos (about 1M parameters at the defaults) and save it in
    `layout` with the tokenizer of `tokenizer_dir`."""
    if family not in FAMILIES or layout not in LAYOUTS:
        raise ValueError(f"family must be one of {sorted(FAMILIES)} and layout one of {LAYOUTS}, got {family!r}, {layout!r}")
    config_class, model_class, fields = FAMILIES[family]
    fields = {key: value(hidden_size, num_heads) if callable(value) else value for key, value in fields.items()}
    tokenizer = pretrained_tokenizer(tokenizer_dir)
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        rope_theta=10000.0,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
        architectures=[model_class.__name__],
        **fields,
    )
    paddle.seed(seed)
    model = model_class(config)
    if layout == "hf":
        save_hf_folder(model, output_dir, tokenizer)
    else:
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen2")
    parser.add_argument("--layout", choices=LAYOUTS, default="paddle")
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--num_kv_heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = build_tiny_model(args.tokenizer_dir, args.output_dir, args.hidden_size, args.num_layers, args.num_heads,
                             args.num_kv_heads, args.seed, args.family, args.layout)
    n_params = sum(int(p.numel()) for p in model.parameters())
    print(f"tiny {args.family} with {n_params} parameters written to {args.output_dir} ({args.layout} layout)")


if __name__ == "__main__":
    main()
