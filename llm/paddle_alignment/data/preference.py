"""Preference data for DPO (pairs) and KTO (single responses marked desirable or not), tokenized.

Row formats, one JSON object per line (or a JSON array, or parquet):
- PaddleNLP's: `{"src": str | [str], "tgt": [str], "response": [a, b], "sort": [x, y]}`: the conversation
  src[0], tgt[0], ..., src[-1] and two replies, the higher `sort` the better. KTO: one response, `sort` [1]
  (desirable) or [0].
- TRL's: `{"prompt", "chosen", "rejected"}` (KTO: `{"prompt", "completion", "label": true|false}`), each a
  string, or chat messages: the prompt a list of turns and each reply a list of assistant turns; or, without a
  prompt, `chosen` and `rejected` whole conversations that differ only in their last (assistant) turn.
- This project's pair files (llm/tools/gen_arith.py, the reward model's data): `{"src", "answer",
  "other_answer", "better"}`.

Text prompts are used as written (PaddleNLP's DPO and KTO turn the chat template off); chat messages are
rendered with the tokenizer's chat template, a reply being what the template writes after the prompt (its
end-of-turn tokens included). A reply ends with EOS. A bad row stops the run naming its file and line; a pair
longer than max_seq_len is cut as PaddleNLP cuts it (the prompt to its last max_prompt_len tokens, then the two
replies in proportion to their lengths, a cut reply losing its EOS), and counted.
"""

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from paddle_alignment.chat_template import render_chat
from paddle_alignment.data.raw import numbered_rows

logger = logging.getLogger(__name__)


@dataclass
class PreferencePair:
    """One prompt and two replies as token ids (each reply with its EOS unless it was cut)."""

    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    where: str = ""


@dataclass
class RatedResponse:
    """One prompt and one reply marked `desirable` or not (KTO), with the reply of another row (`kl_response`)
    that estimates the KL baseline."""

    prompt: list[int]
    response: list[int]
    desirable: bool
    kl_response: list[int] = field(default_factory=list)
    where: str = ""


class RowError(ValueError):
    pass


def is_messages(value):
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def text_of(value, key):
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"{key!r} must be a non-empty string, got {value!r:.80}")
    return value


class RowEncoder:
    """Token ids of prompts and replies in one tokenizer, as the module's docstring says."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def ids(self, text, special=False):
        return self.tokenizer(text, add_special_tokens=special)["input_ids"]

    def reply(self, text):
        return self.ids(text) + [self.tokenizer.eos_token_id]

    def paddlenlp_prompt(self, row):
        """PaddleNLP's src/tgt conversation without a chat template: each src (with the tokenizer's special
        tokens) and each earlier tgt + EOS, in turn."""
        sources = [row["src"]] if isinstance(row["src"], str) else row["src"]
        targets = row.get("tgt") or []
        targets = [targets] if isinstance(targets, str) else targets
        if not isinstance(sources, list) or not sources or len(sources) != len(targets) + 1:
            raise RowError(f"'src' holds {len(sources) if isinstance(sources, list) else sources!r} turns and 'tgt' "
                           f"{len(targets)}: src needs one more turn than tgt (the last is the prompt)")
        prompt = []
        for source, target in zip(sources, targets + [None]):
            prompt += self.ids(text_of(source, "src").strip(), special=True)
            if target is not None:
                prompt += self.reply(text_of(target, "tgt").strip())
        return prompt

    def chat_reply(self, prompt_messages, reply_messages, key):
        """The ids of `reply_messages` as the chat template writes them after `prompt_messages`."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise RowError(f"{key!r} holds chat messages but the tokenizer has no chat template")
        prompt_text = render_chat(self.tokenizer, prompt_messages)
        whole = render_chat(self.tokenizer, list(prompt_messages) + list(reply_messages), add_generation_prompt=False)
        if not whole.startswith(prompt_text):
            raise RowError(f"the chat template does not write {key!r} after the prompt as it renders the prompt alone")
        return self.ids(whole[len(prompt_text):])

    def prompt_and_replies(self, prompt, replies, keys):
        """(prompt ids, [reply ids]) of a TRL-style prompt and replies, strings or chat messages."""
        if is_messages(prompt):
            return self.ids(render_chat(self.tokenizer, prompt)), [
                self.chat_reply(prompt, reply, key) if is_messages(reply) else self.reply(text_of(reply, key))
                for reply, key in zip(replies, keys)
            ]
        return self.ids(text_of(prompt, "prompt")), [self.reply(text_of(reply, key)) for reply, key in zip(replies, keys)]


def pair_from_row(row, encoder):
    """(prompt, chosen, rejected) ids of a row in any of the module's pair formats."""
    if "response" in row or "sort" in row:
        responses, sort = row.get("response"), row.get("sort")
        if not isinstance(responses, list) or not isinstance(sort, list) or len(responses) != 2 or len(sort) != 2:
            raise RowError(f"'response' and 'sort' must be lists of 2 for a pair, got {responses!r:.80} and {sort!r:.80}")
        if sort[0] == sort[1]:
            raise RowError(f"the two responses have equal 'sort' ({sort[0]}): neither is preferred")
        better, worse = (0, 1) if sort[0] > sort[1] else (1, 0)
        texts = [text_of(r, "response").strip() for r in responses]
        return encoder.paddlenlp_prompt(row), encoder.reply(texts[better]), encoder.reply(texts[worse])
    if "chosen" in row and "rejected" in row:
        prompt, chosen, rejected = row.get("prompt"), row["chosen"], row["rejected"]
        if prompt is None:
            if not (is_messages(chosen) and is_messages(rejected)) or chosen[:-1] != rejected[:-1]:
                raise RowError("without 'prompt', 'chosen' and 'rejected' must be conversations that differ only in the last turn")
            prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
        prompt_ids, (chosen_ids, rejected_ids) = encoder.prompt_and_replies(prompt, [chosen, rejected], ["chosen", "rejected"])
        return prompt_ids, chosen_ids, rejected_ids
    if "answer" in row and "other_answer" in row and "better" in row:
        first, second = (encoder.reply(text_of(row[k], k)) for k in ("answer", "other_answer"))
        prompt = encoder.ids(text_of(row.get("src", row.get("prompt")), "src"))
        return (prompt, first, second) if row["better"] else (prompt, second, first)
    raise RowError("not a preference pair: give 'src'/'tgt'/'response'/'sort' (PaddleNLP), 'prompt'/'chosen'/"
                   f"'rejected' (TRL) or 'src'/'answer'/'other_answer'/'better'; the row has {sorted(row)}")


def rated_from_row(row, encoder):
    """(prompt, response, desirable) of a row in any of the module's KTO formats."""
    if "response" in row or "sort" in row:
        responses, sort = row.get("response"), row.get("sort")
        if not isinstance(responses, list) or not isinstance(sort, list) or len(responses) != 1 or len(sort) != 1:
            raise RowError(f"'response' and 'sort' must be lists of 1 for KTO, got {responses!r:.80} and {sort!r:.80}")
        if sort[0] not in (0, 1):
            raise RowError(f"'sort' must be [1] (desirable) or [0] (undesirable), got {sort!r}")
        return encoder.paddlenlp_prompt(row), encoder.reply(text_of(responses[0], "response").strip()), bool(sort[0])
    if "completion" in row and "label" in row:
        if not isinstance(row["label"], bool):
            raise RowError(f"'label' must be true or false, got {row['label']!r}")
        prompt, (response,) = encoder.prompt_and_replies(row.get("prompt"), [row["completion"]], ["completion"])
        return prompt, response, row["label"]
    raise RowError("not a rated response: give 'src'/'tgt'/'response'/'sort' (PaddleNLP) or 'prompt'/'completion'/"
                   f"'label' (TRL); the row has {sorted(row)}")


def cut_to_fit(prompt, replies, max_seq_len, max_prompt_len):
    """PaddleNLP's cut of a prompt and its replies that exceed max_seq_len tokens together (the shared prompt
    counted once): the prompt to its last max_prompt_len tokens, then the replies in proportion to their
    lengths. Returns (prompt, replies, whether anything was cut)."""
    if len(prompt) + sum(map(len, replies)) <= max_seq_len:
        return prompt, replies, False
    prompt = prompt[-max_prompt_len:]
    room = max_seq_len - len(prompt)
    total = sum(map(len, replies))
    if total > room:
        shares = [int(len(r) / total * room) for r in replies]
        shares[-1] = room - sum(shares[:-1])
        replies = [r[:share] for r, share in zip(replies, shares)]
    return prompt, replies, True


def read_preference_file(path, build, max_seq_len, max_prompt_len, kind):
    """[build(row, encoder)...] cut to fit, for every row of each comma-separated data file of `path`; a bad row
    stops the run naming its file and line. Logs how many were cut."""
    items, cut = [], 0
    for file in [p.strip() for p in path.split(",") if p.strip()]:
        if not os.path.isfile(file):
            raise FileNotFoundError(f"preference data file {file} does not exist")
        for line, row in numbered_rows(file):
            where = f"{file}:{line}"
            try:
                prompt, replies, extra = build(row)
            except RowError as error:
                raise ValueError(f"{where}: {error}") from None
            prompt, replies, was_cut = cut_to_fit(prompt, replies, max_seq_len, max_prompt_len)
            if not prompt or not all(replies):
                raise ValueError(f"{where}: max_seq_len={max_seq_len} and max_prompt_len={max_prompt_len} leave no "
                                 "token for the prompt or a reply")
            cut += was_cut
            items.append((prompt, replies, extra, where))
    if not items:
        raise ValueError(f"{path}: no {kind} in the data file(s)")
    if cut:
        logger.warning(f"{path}: {cut} of {len(items)} {kind}s were longer than max_seq_len={max_seq_len} and were cut")
    return items, cut


def preference_pairs(path, tokenizer, max_seq_len, max_prompt_len):
    """The PreferencePairs of the data files `path` (comma separated)."""
    encoder = RowEncoder(tokenizer)

    def build(row):
        prompt, chosen, rejected = pair_from_row(row, encoder)
        if chosen == rejected:
            raise RowError("the chosen and rejected responses are the same")
        return prompt, [chosen, rejected], None

    items, _ = read_preference_file(path, build, max_seq_len, max_prompt_len, "pair")
    return [PreferencePair(prompt, chosen, rejected, where) for prompt, (chosen, rejected), _, where in items]


def rated_responses(path, tokenizer, max_seq_len, max_prompt_len):
    """The RatedResponses of the data files `path`. A row's KL reply is the next row's reply (the last row's, the
    first's: TRL's mismatched pairs), cut to the room the row leaves in max_seq_len (at least one token)."""
    encoder = RowEncoder(tokenizer)

    def build(row):
        prompt, response, desirable = rated_from_row(row, encoder)
        return prompt, [response], desirable

    items, _ = read_preference_file(path, build, max_seq_len, max_prompt_len, "rated response")
    if len(items) < 2:
        raise ValueError(f"{path}: KTO needs at least 2 rows (a row's KL baseline uses another row's response)")
    rated = []
    for index, (prompt, (response,), desirable, where) in enumerate(items):
        other = items[(index + 1) % len(items)][1][0]
        room = max(1, max_seq_len - len(prompt) - len(response))
        rated.append(RatedResponse(prompt, response, desirable, other[:room], where))
    return rated


def fingerprint(items):
    """A digest of the token ids of `items` (PreferencePairs or RatedResponses), in order."""
    digest = hashlib.sha256()
    for item in items:
        fields = {k: v for k, v in vars(item).items() if k != "where"}
        digest.update(json.dumps(fields, sort_keys=True).encode())
    return digest.hexdigest()
