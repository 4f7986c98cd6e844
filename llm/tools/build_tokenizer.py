"""Build a byte-level Qwen2 tokenizer: the 256 byte symbols, no merges, and Qwen's chat special tokens.

Every string round-trips (bytes are the vocabulary), so it serves any task, and
`paddlenlp.transformers.AutoTokenizer.from_pretrained(output_dir)` loads it like a real Qwen2 tokenizer.
"""

import argparse
import json
import os

from paddlenlp.transformers.qwen2.tokenizer import bytes_to_unicode

from paddle_alignment.chat_format import CHAT_TEMPLATE, END_OF_TEXT, IM_END, IM_START

SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]


def build_tokenizer(output_dir):
    """Write vocab.json, merges.txt and the tokenizer config; returns the loaded tokenizer."""
    from paddlenlp.transformers import AutoTokenizer

    os.makedirs(output_dir, exist_ok=True)
    byte_symbols = [bytes_to_unicode()[b] for b in range(256)]
    # The special tokens take fixed ids right after the 256 bytes.
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols + SPECIAL_TOKENS)}
    with open(os.path.join(output_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(output_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
    # Written as AddedToken dicts: plain strings would make the tokenizer strip the spaces and newlines
    # around special tokens, and the chat format would not round-trip.
    special = [
        {"__type": "AddedToken", "content": t, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
        for t in SPECIAL_TOKENS
    ]
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 4096,
        "errors": "replace",
        "bos_token": None,
        "eos_token": special[2],
        "pad_token": special[0],
        "unk_token": special[0],
        "additional_special_tokens": special,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }
    with open(os.path.join(output_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    return AutoTokenizer.from_pretrained(output_dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args()
    tokenizer = build_tokenizer(args.output_dir)
    print(f"tokenizer with {len(tokenizer)} tokens written to {args.output_dir}")


if __name__ == "__main__":
    main()
