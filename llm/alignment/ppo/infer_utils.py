"""Rollout engine: sample `n` responses per prompt and package them as an `Experience`.

This version decodes with paddlenlp's `generate()` (with an explicit attention mask, which CPU needs).
"""

from dataclasses import dataclass

import paddle

from llm.alignment.ppo.experience import Experience


@dataclass(frozen=True)
class SamplingConfig:
    max_dec_len: int
    min_dec_len: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    greedy: bool = False

    @classmethod
    def from_args(cls, args, greedy=False):
        return cls(args.max_dec_len, args.min_dec_len, args.temperature, args.top_p, args.repetition_penalty, greedy)


def left_pad(sequences, pad_id):
    """Left-pad token lists into input_ids and attention_mask tensors [B, P]."""
    width = max(len(s) for s in sequences)
    ids = [[pad_id] * (width - len(s)) + list(s) for s in sequences]
    mask = [[0] * (width - len(s)) + [1] * len(s) for s in sequences]
    return paddle.to_tensor(ids, dtype="int64"), paddle.to_tensor(mask, dtype="int64")


def response_mask_from_tokens(response_ids, eos_token_id):
    """Mask [B, R] of tokens up to and including the first EOS, and whether each row reached EOS."""
    is_eos = (response_ids == eos_token_id).astype("int64")
    eos_seen_before = paddle.cumsum(is_eos, axis=1) - is_eos
    mask = (eos_seen_before == 0).astype("float32")
    return mask, is_eos.sum(axis=1) > 0


@paddle.no_grad()
def generate_rollouts(model, tokenizer, items, n, sampling: SamplingConfig):
    """Sample `n` responses for each prompt item ({"prompt", "label", "input_ids"}) in one batched decode."""
    prompt_ids = [item["input_ids"] for item in items for _ in range(n)]
    input_ids, prompt_mask = left_pad(prompt_ids, tokenizer.pad_token_id)
    was_training = model.training
    model.eval()
    response_ids, _ = model.generate(
        input_ids=input_ids,
        attention_mask=prompt_mask,
        decode_strategy="greedy_search" if sampling.greedy else "sampling",
        max_new_tokens=sampling.max_dec_len,
        min_new_tokens=sampling.min_dec_len,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        repetition_penalty=sampling.repetition_penalty,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    model.train(was_training)
    response_mask, finished = response_mask_from_tokens(response_ids, tokenizer.eos_token_id)
    # Padding after EOS becomes pad tokens, so decoding never shows what the model emitted past the end.
    response_ids = paddle.where(response_mask > 0, response_ids, paddle.full_like(response_ids, tokenizer.pad_token_id))
    # Rewards judge exactly what the model wrote: no clean-up of spaces around punctuation.
    responses = tokenizer.batch_decode(
        response_ids.numpy().tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    return Experience(
        input_ids=paddle.concat([input_ids, response_ids], axis=1),
        attention_mask=paddle.concat([prompt_mask, response_mask.astype("int64")], axis=1),
        response_mask=response_mask,
        group_index=paddle.arange(len(items), dtype="int64").repeat_interleave(n),
        finished=finished,
        prompts=[item["prompt"] for item in items for _ in range(n)],
        labels=[item["label"] for item in items for _ in range(n)],
        responses=responses,
    )
