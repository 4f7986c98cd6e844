"""Tokenized datasets built from a mix of raw datasets: prompt-only (RL), supervised (SFT, ptx),
preference (reward model) and safety preference (cost model).

Every dataset takes a spec (`"PKU-SafeRLHF/train:0.5,alpaca"` or `{name: proportion}`): a proportion
below 1 keeps a seeded random subset of that share, above 1 repeats the dataset (whole copies, then a
random part). Conversations go through the tokenizer's chat template; `src`/`tgt` prompts are used as
they are.
"""

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import paddle

from paddle_alignment.chat_template import render_chat
from paddle_alignment.data import builtin  # noqa: F401  (registers the built-in datasets)
from paddle_alignment.data.raw import load_raw_dataset, parse_dataset_specs

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100

# safe-rlhf's conversation format, for tokenizers without a chat template (e.g. alpaca-7b).
PROMPT_BEGIN, PROMPT_USER, PROMPT_ASSISTANT = "BEGINNING OF CONVERSATION: ", "USER: {text} ", "ASSISTANT:"


def mixed_indices(size, proportion, seed):
    """Indices of a dataset of `size` rows taken in `proportion`: whole passes, then a seeded subset."""
    total = int(round(size * proportion))
    passes, remainder = divmod(total, size)
    subset = np.sort(np.random.RandomState(seed).permutation(size)[:remainder])
    return [i for _ in range(passes) for i in range(size)] + subset.tolist()


def format_prompt(tokenizer, sample, tools=None):
    """The text the model continues: a literal `prompt`, or the conversation before the reply rendered
    with the tokenizer's chat template and the function schemas `tools` as transformers renders them
    (safe-rlhf's format when the tokenizer has none)."""
    if sample.prompt is not None:
        return sample.prompt
    turns = sample.dialogue[:-1] if sample.dialogue else [sample.input] if isinstance(sample.input, str) else list(sample.input)
    if getattr(tokenizer, "chat_template", None):
        roles = ["user", "assistant"]
        messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]
        return render_chat(tokenizer, messages, tools)
    text = PROMPT_BEGIN
    for i, turn in enumerate(turns):
        text += PROMPT_USER.format(text=turn) if i % 2 == 0 else f"{PROMPT_ASSISTANT} {turn} "
    return text + PROMPT_ASSISTANT


def encode_completion(tokenizer, prompt, completion, add_eos=True):
    """Token ids of prompt + completion (+ EOS), each tokenized on its own as rollouts produce them."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] + tokenizer(completion, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id] if add_eos else ids


LABEL_CHECK_THREADS = 4


def require(sample, names, where):
    for name in names:
        if getattr(sample, name) is None:
            raise ValueError(f"{where}: missing {name!r}, which this dataset type needs")


class TokenizedDataset(paddle.io.Dataset):
    """Items built by `self.build(sample, where)` (None drops the sample) from every raw dataset of the mix."""

    def __init__(self, datasets, tokenizer, seed=42, prompt_key="src", label_key="tgt"):
        self.tokenizer, self.label_key = tokenizer, label_key
        self.items, self.dropped = [], 0
        for spec in parse_dataset_specs(datasets):
            raw = load_raw_dataset(spec, prompt_key=prompt_key, label_key=label_key)
            for index in mixed_indices(len(raw), spec.proportion, seed):
                item = self.build(raw[index], raw.location(index))
                if item is None:
                    self.dropped += 1
                else:
                    self.items.append(item)
        if not self.items:
            raise ValueError(f"{datasets}: no usable example ({self.dropped} dropped: too long, or pairs of identical sequences)")

    def build(self, sample, where):
        raise NotImplementedError

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


class PromptOnlyDataset(TokenizedDataset):
    """Prompts for rollouts: item = {"prompt": str, "label": str, "input_ids": list[int]}. The label (the
    reference answer) goes to rule rewards and the reward server, so with `require_label` a row without
    one stops the run; else it is "". `check_label` (the rule reward's `target_refusal`) says why the reward
    cannot read a label (None: it can): the run stops before training, naming the file, line and value.
    Prompts over `max_prompt_len` tokens are truncated on the tokenizer's truncation side (PaddleNLP's
    RLHFDataset; the reward still sees the whole prompt text), or skipped with `filter_overlong_prompts`.
    With `environment_of` (multi-turn environments), item["environment"] is `environment_of(name, where)` of the
    row's `environment` column, which raises for a name that is not configured. `tools` (the schemas of the run's
    tools) go into conversation prompts where the chat template shows them."""

    def __init__(
        self, datasets, tokenizer, max_prompt_len, max_samples=0, require_label=False, filter_overlong_prompts=False,
        check_label=None, environment_of=None, tools=None, **options,
    ):
        self.max_prompt_len, self.require_label, self.environment_of = max_prompt_len, require_label, environment_of
        self.tools = tools
        self.filter_overlong_prompts, self.truncated = filter_overlong_prompts, 0
        self.locations = []
        super().__init__(datasets, tokenizer, **options)
        if check_label is not None:
            check_labels(check_label, [item["label"] for item in self.items], self.locations, self.label_key)
        if max_samples > 0:
            self.items = self.items[:max_samples]
        if self.dropped:
            logger.warning(f"{datasets}: skipped {self.dropped} prompts longer than max_prompt_len={max_prompt_len}")
        if self.truncated:
            logger.warning(f"{datasets}: truncated {self.truncated} prompts to max_prompt_len={max_prompt_len} tokens")

    def build(self, sample, where):
        if self.require_label and sample.answer is None:
            raise ValueError(f"{where}: no reference answer (column {self.label_key!r} or 'answer'), which the reward needs")
        prompt = format_prompt(self.tokenizer, sample, self.tools)
        input_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if len(input_ids) > self.max_prompt_len:
            if self.filter_overlong_prompts:
                return None
            self.truncated += 1
            keep_end = getattr(self.tokenizer, "truncation_side", "right") == "left"
            input_ids = input_ids[-self.max_prompt_len :] if keep_end else input_ids[: self.max_prompt_len]
        self.locations.append(where)
        item = {"prompt": prompt, "label": sample.answer or "", "input_ids": input_ids}
        if self.environment_of is not None:
            item["environment"] = self.environment_of(sample.environment or "", where)
        return item


def check_labels(check_label, labels, locations, label_key):
    """Raise a ValueError naming the first label (in data order) that `check_label` refuses (it returns why, or
    None). Distinct labels are checked once, on threads: a symbolic reference is parsed in a worker process."""
    distinct = list(dict.fromkeys(labels))
    with ThreadPoolExecutor(LABEL_CHECK_THREADS) as pool:
        problems = dict(zip(distinct, pool.map(check_label, distinct)))
    for label, where in zip(labels, locations):
        if problems[label] is not None:
            raise ValueError(f"{where}: the reward cannot read the reference answer ({label_key!r}): {problems[label]}")


class SupervisedDataset(TokenizedDataset):
    """Demonstrations: item = {"input_ids", "labels"}, the loss on the reply and EOS only. Labels are
    shifted by one, as paddlenlp's causal-LM criterion expects: labels[i] is the token after input_ids[i].
    Examples over `max_length` tokens are cut."""

    def __init__(self, datasets, tokenizer, max_length, **options):
        self.max_length, self.truncated = max_length, 0
        super().__init__(datasets, tokenizer, **options)
        if self.truncated:
            logger.warning(f"{datasets}: {self.truncated} examples were cut to max_length={max_length}")

    def build(self, sample, where):
        reply = sample.dialogue[-1] if sample.dialogue else sample.answer
        if reply is None:
            raise ValueError(f"{where}: no reply (column {self.label_key!r}, 'answer' or 'dialogue'), which supervised data needs")
        prompt = self.tokenizer(format_prompt(self.tokenizer, sample), add_special_tokens=False)["input_ids"]
        target = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        tokens = (prompt + target)[: self.max_length + 1]
        self.truncated += len(prompt + target) > self.max_length + 1
        # Shifted by one; slicing (not `len(prompt) - 1` ignore slots) keeps it right for an empty prompt.
        labels = ([IGNORE_INDEX] * len(prompt) + target)[1:]
        return {"input_ids": tokens[:-1], "labels": labels[: len(tokens) - 1]}


class PairDataset(TokenizedDataset):
    """Two replies to one prompt, each tokenized as prompt + reply + EOS and cut to `max_length`; pairs whose
    two sequences are identical teach nothing and are dropped. Subclasses name the FIELDS they need."""

    FIELDS = ("answer", "other_answer")

    def __init__(self, datasets, tokenizer, max_length, **options):
        self.max_length = max_length
        super().__init__(datasets, tokenizer, **options)

    def encode_pair(self, sample, where):
        """(ids of answer, ids of other_answer), or None when they are the same."""
        require(sample, self.FIELDS, where)
        prompt = format_prompt(self.tokenizer, sample)
        first, second = (encode_completion(self.tokenizer, prompt, a)[: self.max_length] for a in (sample.answer, sample.other_answer))
        return None if first == second else (first, second)


class PreferenceDataset(PairDataset):
    """Pairs for reward-model training: item = {"better_input_ids", "worse_input_ids"}."""

    FIELDS = ("answer", "other_answer", "better")

    def build(self, sample, where):
        pair = self.encode_pair(sample, where)
        if pair is None:
            return None
        better, worse = pair if sample.better else pair[::-1]
        return {"better_input_ids": better, "worse_input_ids": worse}


class SafetyPreferenceDataset(PairDataset):
    """Pairs for cost-model training: item = {"safer_input_ids", "unsafer_input_ids", "safer_sign",
    "unsafer_sign"}, the sign +1 for a safe reply and -1 for an unsafe one (safe-rlhf's convention)."""

    FIELDS = ("answer", "other_answer", "safer", "is_safe", "is_other_safe")

    def build(self, sample, where):
        pair = self.encode_pair(sample, where)
        if pair is None:
            return None
        signs = (1 if sample.is_safe else -1, 1 if sample.is_other_safe else -1)
        (safer, safer_sign), (unsafer, unsafer_sign) = zip(pair, signs) if sample.safer else zip(pair[::-1], signs[::-1])
        return {"safer_input_ids": safer, "unsafer_input_ids": unsafer, "safer_sign": safer_sign, "unsafer_sign": unsafer_sign}


def pad_right(sequences, pad_id):
    """Lists of ids -> (ids [N, L], attention mask [N, L]) int64 tensors, padded on the right."""
    width = max(len(s) for s in sequences)
    ids = np.full((len(sequences), width), pad_id, dtype="int64")
    mask = np.zeros((len(sequences), width), dtype="int64")
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
    return paddle.to_tensor(ids), paddle.to_tensor(mask)


class PreferenceCollator:
    """Batch of PreferenceDataset items -> {"input_ids", "attention_mask"} [2N, L]: the N better
    sequences first, then the N worse ones, so one forward pass scores both."""

    def __init__(self, pad_token_id):
        self.pad_token_id = pad_token_id

    def __call__(self, items):
        sequences = [item["better_input_ids"] for item in items] + [item["worse_input_ids"] for item in items]
        input_ids, attention_mask = pad_right(sequences, self.pad_token_id)
        return {"input_ids": input_ids, "attention_mask": attention_mask}
