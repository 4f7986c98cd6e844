"""Build a byte-level Qwen2 tokenizer: the 256 byte symbols, no merges, and Qwen's chat special tokens.

Every string round-trips (bytes are the vocabulary), so it serves any task, and
`paddlenlp.transformers.AutoTokenizer.from_pretrained(output_dir)` loads it like a real Qwen2 tokenizer.

`--tool_tags` builds the tool task's tokenizer: Qwen2.5's <tool_call> and </tool_call> tokens (not special:
they stay in decoded text, so calls can be parsed), and merges that make each multi-character piece of the
tool-call and tool-answer format one token (`name`, `":`, `expression`, `assistant` ...). With merges,
decoding and encoding again is no longer the identity (n a m e sampled byte by byte encodes back to `name`),
as with every real tokenizer, so a defect that re-tokenises trajectories shows in the tool task.
"""

import argparse
import json
import os

import regex
from paddlenlp.transformers.qwen2.tokenizer import PRETOKENIZE_REGEX, bytes_to_unicode

from llm.tools.build_real_tokenizer import byte_symbols, tokenizer_json

from paddle_alignment.models.loading import pretrained_tokenizer
from paddle_alignment.chat_format import (
    CHAT_TEMPLATE, END_OF_TEXT, IM_END, IM_START, TOOL_CALL_END, TOOL_CALL_START, render_chat, tool_call_text,
)

SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
# A tool call and its answer, whose pieces become tokens with --tool_tags.
TOOL_FORMAT_SAMPLE = render_chat([
    {"role": "system", "content": "system"},
    {"role": "user", "content": "12*34="},
    {"role": "assistant", "content": tool_call_text("calc", {"expression": "12*34"})},
    {"role": "tool", "content": "408"},
])


def format_merges(text, added_tokens):
    """BPE merges that make each piece of `text` (outside `added_tokens`, as Qwen2's pre-tokenizer splits it)
    with two or more characters and no digit one token, merging left to right; in byte symbols, in
    first-seen order."""
    to_symbols = bytes_to_unicode()
    merges = []
    for part in regex.split("|".join(map(regex.escape, added_tokens)), text):
        for piece in regex.findall(PRETOKENIZE_REGEX, part):
            symbols = "".join(to_symbols[b] for b in piece.encode("utf-8"))
            if len(symbols) < 2 or regex.search(r"\p{N}", piece):
                continue
            merges += [merge for end in range(2, len(symbols) + 1) if (merge := (symbols[: end - 1], symbols[end - 1])) not in merges]
    return merges


def added_token(content, special):
    # Written as AddedToken dicts: plain strings would make the tokenizer strip the spaces and newlines
    # around special tokens, and the chat format would not round-trip.
    return {"content": content, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False, "special": special}


def build_tokenizer(output_dir, tool_tags=False):
    """Write vocab.json, merges.txt and the tokenizer config; returns the loaded tokenizer. `tool_tags`: the
    tool task's tokens and merges (see above)."""
    os.makedirs(output_dir, exist_ok=True)
    # The special tokens take fixed ids right after the 256 bytes, then the tool tags, then the merged pieces.
    tags = [TOOL_CALL_START, TOOL_CALL_END] if tool_tags else []
    merges = format_merges(TOOL_FORMAT_SAMPLE, SPECIAL_TOKENS + tags) if tool_tags else []
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols() + SPECIAL_TOKENS + tags + [a + b for a, b in merges])}
    with open(os.path.join(output_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(output_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    special = [{"__type": "AddedToken", **added_token(t, True)} for t in SPECIAL_TOKENS]
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 4096,
        "errors": "replace",
        "bos_token": None,
        "eos_token": special[2],
        "pad_token": special[0],
        "unk_token": special[0],
        "additional_special_tokens": special,
        # Qwen2.5's tool tags are added tokens that are not special: they stay in decoded text.
        "added_tokens_decoder": {str(vocab[t]): added_token(t, False) for t in tags},
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }
    with open(os.path.join(output_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    if tool_tags:
        # paddlenlp's Python Qwen2Tokenizer splits text only at special tokens, so it would spell the tags
        # byte by byte; tokenizer.json gives the `tokenizers` library's tokenizer, which keeps them whole, as
        # transformers does (models/loading.py pretrained_tokenizer).
        added = {vocab[t]: (t, t in SPECIAL_TOKENS) for t in SPECIAL_TOKENS + tags}
        with open(os.path.join(output_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_json(vocab, added, merges), f, ensure_ascii=False)
    return pretrained_tokenizer(output_dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--tool_tags", action="store_true", help="the tool task's tokens and merges")
    args = parser.parse_args()
    tokenizer = build_tokenizer(args.output_dir, args.tool_tags)
    print(f"tokenizer with {len(tokenizer)} tokens written to {args.output_dir}")


if __name__ == "__main__":
    main()
