"""Build a byte-level tokenizer with a real model family's vocabulary size and special tokens, in the
files Hugging Face ships (tokenizer.json, tokenizer_config.json with the chat template, vocab.json,
merges.txt).

Ids 0-255 are the bytes, so every string round-trips as in the tiny world's tokenizer; the family's
special tokens sit at their real ids (Qwen2.5's <|endoftext|> 151643, <|im_start|> 151644, <|im_end|>
151645 ... <|file_sep|> 151664; Llama 3's <|begin_of_text|> 128000 ... <|eot_id|> 128009 and the
reserved tokens up to 128255); every other id up to the model's vocabulary size is a placeholder token
`<phN>` that text never encodes to but that decodes (Qwen's own config pads its 151,665 tokens to 151,936
rows in the same way; here the placeholders are tokens, so a random model's samples decode).
"""

import argparse
import json
import os

from paddlenlp.transformers.qwen2.tokenizer import PRETOKENIZE_REGEX, bytes_to_unicode

from paddle_alignment.chat_format import CHAT_TEMPLATE

QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
)
# Qwen2.5 marks its tool-call and fill-in-the-middle tokens as not special: they stay in decoded text.
QWEN_NON_SPECIAL = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
)
LLAMA3_NAMED = {
    128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128004: "<|finetune_right_pad_id|>",
    128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>",
    128010: "<|python_tag|>",
}
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def qwen_family():
    """(added tokens {id: (content, special)}, tokenizer_config entries) of Qwen2.5."""
    added = {151643 + i: (token, True) for i, token in enumerate(QWEN_SPECIALS)}
    added.update({151643 + len(QWEN_SPECIALS) + i: (token, False) for i, token in enumerate(QWEN_NON_SPECIAL)})
    config = {
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072,
    }
    return added, config


# Qwen3 adds these after Qwen2.5's tokens, not special either: tool answers and thinking stay in decoded text.
QWEN3_NON_SPECIAL = ("<tool_response>", "</tool_response>", "<think>", "</think>")


def qwen3_family():
    """(added tokens, tokenizer_config entries) of Qwen3: Qwen2.5's, then QWEN3_NON_SPECIAL."""
    added, config = qwen_family()
    added.update({max(added) + 1 + i: (token, False) for i, token in enumerate(QWEN3_NON_SPECIAL)})
    return added, config


def llama3_family():
    """(added tokens, tokenizer_config entries) of Llama 3: 256 special tokens from 128000, the unnamed ones reserved."""
    reserved = (i for i in range(1000))
    added = {i: (LLAMA3_NAMED.get(i) or f"<|reserved_special_token_{next(reserved)}|>", True) for i in range(128000, 128256)}
    config = {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None, "unk_token": None,
        "chat_template": LLAMA3_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
    }
    return added, config


FAMILIES = {"qwen2": qwen_family, "qwen3": qwen3_family, "llama": llama3_family}


def byte_symbols():
    return [bytes_to_unicode()[b] for b in range(256)]


def tokenizer_json(vocab, added, merges=()):
    """tokenizer.json of the `tokenizers` library: byte-level BPE with `merges` ((left, right) pairs) over
    `vocab`, plus `added`. With merges, text is first split as Qwen2's pre-tokenizer splits it (merges act
    within the pieces); without, no split is needed."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    split = {"type": "Split", "pattern": {"Regex": PRETOKENIZE_REGEX}, "behavior": "Isolated", "invert": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": special}
            for i, (content, special) in sorted(added.items())
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]} if merges else byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
            "merges": [f"{left} {right}" for left, right in merges],
        },
    }


def build_real_tokenizer(output_dir, family, vocab_size):
    """Write the tokenizer files of `family` ("qwen2" or "llama") covering `vocab_size` ids into `output_dir`."""
    added, config = FAMILIES[family]()
    if max(added) >= vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for the {family} special tokens (up to id {max(added)})")
    symbols = byte_symbols()
    vocab = {symbols[i] if i < 256 else f"<ph{i}>": i for i in range(vocab_size) if i not in added}
    os.makedirs(output_dir, exist_ok=True)
    write_json(vocab, os.path.join(output_dir, "vocab.json"))
    with open(os.path.join(output_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
    # tokenizer.json's model vocabulary holds the special tokens too: `tokenizers` numbers added tokens the
    # model lacks after the model's vocabulary, whatever ids the file gives them (Qwen's are contiguous).
    with_added = {**vocab, **{content: i for i, (content, _) in added.items()}}
    write_json(tokenizer_json(with_added, added), os.path.join(output_dir, "tokenizer.json"))
    decoder = {
        str(i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": special}
        for i, (content, special) in sorted(added.items())
    }
    config = {
        "added_tokens_decoder": decoder, **config, "clean_up_tokenization_spaces": False, "errors": "replace",
        "split_special_tokens": False,
    }
    write_json(config, os.path.join(output_dir, "tokenizer_config.json"))


def write_json(value, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=2)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen2")
    parser.add_argument("--vocab_size", type=int, default=151936)
    args = parser.parse_args()
    build_real_tokenizer(args.output_dir, args.family, args.vocab_size)
    print(f"{args.family} tokenizer with {args.vocab_size} tokens written to {args.output_dir}")


if __name__ == "__main__":
    main()
