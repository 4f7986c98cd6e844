"""Prompt-only and supervised datasets read from `src`/`tgt` jsonl files."""

import json
import logging

logger = logging.getLogger(__name__)


def read_jsonl(paths, required_keys):
    """Rows of the comma-separated jsonl `paths`; a bad line stops with an error naming file and line."""
    rows = []
    for path in [p.strip() for p in paths.split(",") if p.strip()]:
        try:
            f = open(path, encoding="utf-8")
        except OSError as error:
            raise FileNotFoundError(f"dataset file {path} cannot be read: {error}") from None
        with f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                rows.append(parse_row(line, path, line_number, required_keys))
    if not rows:
        raise ValueError(f"dataset {paths} holds no rows")
    return rows


def parse_row(line, path, line_number, required_keys):
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{line_number}: not valid JSON ({error})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{line_number}: a row must be a JSON object")
    for key in required_keys:
        if not isinstance(row.get(key), str):
            raise ValueError(f"{path}:{line_number}: missing string field {key!r}")
    return row


class PromptDataset:
    """Prompts for rollouts: item = {"prompt": str, "label": str, "input_ids": list[int]}.

    Prompts longer than `max_prompt_len` tokens are skipped, and their number is logged.
    """

    def __init__(self, paths, tokenizer, max_prompt_len, prompt_key="src", label_key="tgt", max_samples=0):
        rows = read_jsonl(paths, [prompt_key, label_key])
        if max_samples > 0:
            rows = rows[:max_samples]
        self.items = []
        for row in rows:
            input_ids = tokenizer(row[prompt_key], add_special_tokens=False)["input_ids"]
            if len(input_ids) <= max_prompt_len:
                self.items.append({"prompt": row[prompt_key], "label": row[label_key], "input_ids": input_ids})
        skipped = len(rows) - len(self.items)
        if skipped:
            logger.warning(f"{paths}: skipped {skipped} of {len(rows)} prompts longer than max_prompt_len={max_prompt_len}")
        if not self.items:
            raise ValueError(f"{paths}: every prompt is longer than max_prompt_len={max_prompt_len}")

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


class SupervisedDataset:
    """SFT examples: the prompt followed by the target and EOS, with the loss on target tokens only.

    Labels are shifted by one here, as paddlenlp's causal-LM criterion expects: labels[i] is the token after input_ids[i].
    """

    IGNORE_INDEX = -100

    def __init__(self, paths, tokenizer, max_length, prompt_key="src", label_key="tgt"):
        rows = read_jsonl(paths, [prompt_key, label_key])
        self.items = []
        truncated = 0
        for row in rows:
            prompt = tokenizer(row[prompt_key], add_special_tokens=False)["input_ids"]
            target = tokenizer(row[label_key], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            tokens = (prompt + target)[: max_length + 1]
            truncated += len(prompt + target) > max_length + 1
            labels = [self.IGNORE_INDEX] * (len(prompt) - 1) + target
            self.items.append({"input_ids": tokens[:-1], "labels": labels[: len(tokens) - 1]})
        if truncated:
            logger.warning(f"{paths}: {truncated} examples were cut to max_length={max_length}")

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]
