"""Token lists to tensors and back, the two conversions every stage that samples shares (the decode loop,
multi-turn trajectories, the LLM judge), and the ids a response ends at."""

import paddle


def left_pad(sequences, pad_id):
    """Left-pad token lists into input_ids and attention_mask tensors [B, P]."""
    width = max(len(s) for s in sequences)
    ids = [[pad_id] * (width - len(s)) + list(s) for s in sequences]
    mask = [[0] * (width - len(s)) + [1] * len(s) for s in sequences]
    return paddle.to_tensor(ids, dtype="int64"), paddle.to_tensor(mask, dtype="int64")


def decode_responses(tokenizer, rows):
    """The texts of token-id `rows` without special tokens, and without clean-up of spaces around punctuation
    (rewards judge exactly what the model wrote): `tokenizer.batch_decode(rows, skip_special_tokens=True,
    clean_up_tokenization_spaces=False)`, with the special ids dropped here, once per batch: paddlenlp's slow
    tokenizers rebuild their list of special ids twice for every token when they skip them themselves, most
    of the time decoding takes."""
    special = set(tokenizer.all_special_ids)
    kept = [[token for token in row if token not in special] for row in rows]
    return tokenizer.batch_decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def end_ids(tokenizer):
    """The ids a sampled response ends at: the tokenizer's EOS first, then the other end ids of the model folder's
    generation_config.json (load_tokenizer sets them: Llama 3.1 Instruct ends at <|eot_id|>, <|eom_id|> and
    <|end_of_text|>, Qwen2.5 at <|im_end|> and <|endoftext|>)."""
    return getattr(tokenizer, "end_token_ids", None) or [tokenizer.eos_token_id]


def through_first_end(ids, ends):
    """How many of the token list `ids` run up to and including its first id of `ends` (all of them without one)."""
    return next((position + 1 for position, token in enumerate(ids) if token in ends), len(ids))
