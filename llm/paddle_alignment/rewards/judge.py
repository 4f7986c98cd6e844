"""A generative reward: an LLM judge asked, with a prompt template, how good each response is.

The judge is a local causal LM (`judge_model_name_or_path`, Paddle's or Hugging Face's layout, decoding greedily
on this project's decode loop) or any server that speaks the reward-server protocol (`judge_server`: the filled
template is the request's `src`, and its `score` the verdict). The template's {prompt}, {response} and
{reference} are replaced by the rollout's prompt, response and reference answer; a local judge's reply must
hold its verdict as the first group of `judge_verdict_pattern` (default `[[<number>]]`, MT-Bench's form).

A verdict that cannot be read (a reply without the pattern, a server's row error) is never scored 0 or 0.5:
its row leaves the batch before advantages are computed (counted in `judge/excluded_frac`, the first replies
logged), so nothing the judge did not say trains the policy. A judge that is down stops the run after the
client's retries, with an error naming it (rewards/client.py). The judge's identity and a hash of its prompt
template and pattern are written with every checkpoint (`judge.json`); resuming with another judge stops.
"""

import hashlib
import json
import os
import re

from paddle_alignment.rewards import ScoredBatch, shown
from paddle_alignment.rewards.client import server_client

JUDGE_RECORD_NAME = "judge.json"
DEFAULT_VERDICT_PATTERN = r"\[\[(-?\d+(?:\.\d+)?)\]\]"
DEFAULT_TEMPLATE = (
    "Please act as an impartial judge and grade the response to the question below against the reference answer.\n\n"
    "[Question]\n{prompt}\n\n[Reference answer]\n{reference}\n\n[Response]\n{response}\n\n"
    "Reply with [[1]] if the response reaches the reference answer, and [[0]] if it does not."
)
PLACEHOLDERS = ("{prompt}", "{response}", "{reference}")


def read_template(value):
    """The template text: the file `value` names, the text `value` itself, or the default when empty."""
    if not value:
        return DEFAULT_TEMPLATE
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    return value


def fill(template, prompt, response, reference):
    """The template with its placeholders replaced; braces elsewhere (a JSON example) are kept as they are."""
    values = {"{prompt}": prompt, "{response}": response, "{reference}": reference}
    return re.sub("|".join(map(re.escape, PLACEHOLDERS)), lambda match: values[match.group(0)], template)


def read_verdict(reply, pattern):
    """The score in a judge's `reply` (the first group of `pattern`), or None when there is none."""
    match = pattern.search(reply)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except (IndexError, ValueError):
        return None


def folder_identity(path):
    """A local judge's identity: its folder, and a hash of its config and of its weight files' names and sizes
    (hashing gigabytes of weights at every start would cost minutes)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name == "config.json":
            with open(full, "rb") as f:
                digest.update(f.read())
        elif name.endswith((".safetensors", ".pdparams", ".bin")):
            digest.update(f"{name}:{os.path.getsize(full)}".encode())
    return {"judge": f"model:{os.path.abspath(path)}", "model_sha256": digest.hexdigest()}


class JudgeScorer:
    """Scores with an LLM judge: `ask(requests, exp)` gets the filled templates and returns a ScoredBatch of
    replies read (LocalJudge) or of the server's scores (ServerJudge). Rows whose verdict was not read are in
    its `errors` and leave the batch (`excludes_unscored`)."""

    task_name = None
    parts = {}
    excludes_unscored = True

    def __init__(self, ask, template, identity, max_score=None, pattern=DEFAULT_VERDICT_PATTERN):
        missing = [p for p in PLACEHOLDERS[:2] if p not in template]
        if missing:
            raise ValueError(f"judge_prompt_template has no {' or '.join(missing)}: the judge would not see what it grades")
        self.ask, self.template, self.max_score = ask, template, max_score
        prompt_sha256 = hashlib.sha256(f"{template}\n{pattern}".encode()).hexdigest()
        self.record = {**identity, "prompt_sha256": prompt_sha256}

    def score(self, exp):
        requests = [fill(self.template, p, r, label) for p, r, label in zip(exp.prompts, exp.responses, exp.labels)]
        return self.ask(requests, exp)


class LocalJudge:
    """Asks a local causal LM: each request a user turn of its chat template (the text as it is without one),
    answered greedily in batches of `batch_size` with at most `max_new_tokens` tokens by `decode(model,
    tokenizer, items, max_new_tokens, use_fast)`, the rollout's decode loop (rollout/decode.py greedy_responses),
    which the run hands the judge."""

    def __init__(self, model, tokenizer, pattern, max_new_tokens, batch_size, decode, use_fast=True):
        self.model, self.tokenizer, self.pattern = model, tokenizer, re.compile(pattern)
        self.max_new_tokens, self.batch_size, self.decode, self.use_fast = max_new_tokens, batch_size, decode, use_fast

    def render(self, request):
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": request}], tokenize=False, add_generation_prompt=True)
        return request

    def replies(self, requests):
        items = [
            {"prompt": text, "label": "", "input_ids": self.tokenizer.encode(text, add_special_tokens=False)["input_ids"]}
            for text in map(self.render, requests)
        ]
        return [
            reply
            for start in range(0, len(items), self.batch_size)
            for reply in self.decode(self.model, self.tokenizer, items[start : start + self.batch_size], self.max_new_tokens, self.use_fast)
        ]

    def __call__(self, requests, exp):
        replies = self.replies(requests)
        batch = ScoredBatch([])
        for row, reply in enumerate(replies):
            verdict = read_verdict(reply, self.pattern)
            batch.scores.append(0.0 if verdict is None else verdict)
            if verdict is None:
                batch.errors.append((row, f"the judge's reply has no verdict: {shown(reply)}"))
        return batch


class ServerJudge:
    """Asks a server of the reward-server protocol: the filled template as `src`; its row errors are the verdicts
    it could not give."""

    def __init__(self, client):
        self.client = client

    def __call__(self, requests, exp):
        return self.client.score(requests, exp.labels, exp.responses)


def build_judge_scorer(args, decode):
    """The JudgeScorer of the config's judge_* keys (a local model or a server); `decode`: what answers a local
    judge's requests (LocalJudge)."""
    template = read_template(args.judge_prompt_template)
    if args.judge_server:
        client = server_client(args, args.judge_server, name="judge server")
        return JudgeScorer(ServerJudge(client), template, {"judge": f"server:{client.url}"}, args.judge_max_score)
    from paddle_alignment.models.loading import load_policy

    model, tokenizer = load_policy(args.judge_model_name_or_path)
    judge = LocalJudge(model, tokenizer, args.judge_verdict_pattern, args.judge_max_new_tokens,
                       args.per_device_reward_batch_size, decode, args.use_fusemt)
    identity = folder_identity(args.judge_model_name_or_path)
    return JudgeScorer(judge, template, identity, args.judge_max_score, args.judge_verdict_pattern)


def save_judge_record(scorer, folder):
    """judge.json in `folder` when the reward is a judge's."""
    record = getattr(scorer, "record", None)
    if record is not None:
        with open(os.path.join(folder, JUDGE_RECORD_NAME), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)


def check_judge_record(scorer, folder):
    """Stop a resume whose judge, or prompt, differs from the one the checkpoint in `folder` was trained with:
    the reward would change mid-run."""
    path = os.path.join(folder, JUDGE_RECORD_NAME)
    record = getattr(scorer, "record", None)
    saved = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    if saved == record:
        return
    if saved is None or record is None:
        raise ValueError(
            f"{folder} was trained {'with the judge ' + saved['judge'] if saved else 'without a judge'}; this run scores "
            f"{'with the judge ' + record['judge'] if record else 'without one'}: the reward would change mid-run"
        )
    changed = sorted(key for key in set(saved) | set(record) if saved.get(key) != record.get(key))
    raise ValueError(
        f"{folder} was trained with another judge or prompt ({', '.join(changed)} differ: {saved} then, {record} now): "
        "the reward would change mid-run; resume with the same judge_* keys or start a new output_dir"
    )

