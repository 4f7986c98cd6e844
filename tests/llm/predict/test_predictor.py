"""llm/predict/predictor.py: the output file contract, parity with the trainer's greedy rollouts, batch size
independence, chat over a scripted stdin, and errors that name the bad input."""

import io
import json
import os
import subprocess
import sys

import pytest
from paddlenlp.transformers import AutoModelForCausalLM

from helpers import REPO_ROOT
from llm.predict import predictor
from paddle_alignment.data import PromptOnlyDataset
from paddle_alignment.models.loading import load_tokenizer
from paddle_alignment.rollout.decode import SamplingConfig, generate_rollouts

GREEDY = ["--decode_strategy", "greedy_search", "--max_length", "12"]


@pytest.fixture(scope="module")
def eval_file(tiny_world, tmp_path_factory):
    """Held-out rows and two of other lengths (so batches are left-padded), each with an extra column the
    output must keep."""
    rows = [json.loads(line) for line in open(tiny_world["eval"])][:10] + [{"src": "12+3+45=", "tgt": "60"}, {"src": "9+", "tgt": "9"}]
    path = str(tmp_path_factory.mktemp("predict") / "eval.jsonl")
    write_rows(path, [{**row, "id": index} for index, row in enumerate(rows)])
    return path


def write_rows(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def predict(tiny_world, data_file, output_file, *flags):
    predictor.main(["--model_name_or_path", tiny_world["model"], "--data_file", data_file, "--output_file", output_file, *flags])
    return [json.loads(line) for line in open(output_file, encoding="utf-8")]


def test_output_rows_are_the_input_rows_plus_output(tiny_world, eval_file, tmp_path):
    outputs = predict(tiny_world, eval_file, str(tmp_path / "sub" / "out.jsonl"), *GREEDY)
    inputs = [json.loads(line) for line in open(eval_file)]
    assert [{k: v for k, v in row.items() if k != "output"} for row in outputs] == inputs
    assert all(isinstance(row["output"], str) for row in outputs)


@pytest.mark.parametrize(
    "greedy_flags", [[], ["--decode_strategy", "greedy_search"], ["--decode_strategy", "sampling", "--top_k", "1", "--top_p", "1"]]
)
def test_greedy_outputs_equal_the_trainers_greedy_rollouts(tiny_world, eval_file, tmp_path, greedy_flags):
    outputs = predict(tiny_world, eval_file, str(tmp_path / "out.jsonl"), "--max_length", "12", "--batch_size", "4", *greedy_flags)
    # The trainer's prompts: PromptOnlyDataset over the same file, decoded greedily with the same limits.
    tokenizer = load_tokenizer(tiny_world["model"])
    items = PromptOnlyDataset(eval_file, tokenizer, max_prompt_len=1024).items
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    rollouts = generate_rollouts(model, tokenizer, items, 1, SamplingConfig(max_dec_len=12, min_dec_len=1, greedy=True))
    assert [row["output"] for row in outputs] == rollouts.responses


def test_outputs_do_not_depend_on_the_batch_size(tiny_world, eval_file, tmp_path):
    one = predict(tiny_world, eval_file, str(tmp_path / "one.jsonl"), *GREEDY, "--batch_size", "1")
    five = predict(tiny_world, eval_file, str(tmp_path / "five.jsonl"), *GREEDY, "--batch_size", "5")
    assert one == five


def test_chat_keeps_the_history_through_the_chat_template(tiny_world, monkeypatch):
    prompts = []
    generate = predictor.generate_responses

    def recording(model, tokenizer, items, sampling):
        prompts.extend(item["prompt"] for item in items)
        return generate(model, tokenizer, items, sampling)

    monkeypatch.setattr(predictor, "generate_responses", recording)
    stdout = io.StringIO()
    predictor.main(["--model_name_or_path", tiny_world["model"], "--chat", *GREEDY], io.StringIO("1+2+3=\n\n4+5+6=\nexit\nnot read\n"), stdout)
    replies = [line.split("assistant: ", 1)[1] for line in stdout.getvalue().splitlines() if "assistant: " in line]
    assert len(prompts) == len(replies) == 2
    tokenizer = load_tokenizer(tiny_world["model"])
    conversation = [{"role": "user", "content": "1+2+3="}, {"role": "assistant", "content": replies[0]}, {"role": "user", "content": "4+5+6="}]
    assert prompts[0] == tokenizer.apply_chat_template(conversation[:1], tokenize=False, add_generation_prompt=True)
    assert prompts[1] == tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


def test_the_script_path_chats_until_end_of_input(tiny_world):
    script = os.path.join(REPO_ROOT, "llm", "predict", "predictor.py")
    result = subprocess.run(
        [sys.executable, script, "--model_name_or_path", tiny_world["model"], "--chat", *GREEDY],
        input="1+2+3=\n", capture_output=True, text=True, cwd="/", timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("assistant: ") == 1


@pytest.mark.parametrize(
    "flags, error, message",
    [
        (["--data_file", "missing.jsonl"], FileNotFoundError, "--data_file missing.jsonl"),
        ([], ValueError, "--data_file"),
        (["--chat", "--batch_size", "0"], ValueError, "--batch_size"),
        (["--chat", "--top_p", "1.5"], ValueError, "--top_p"),
        (["--chat", "--decode_strategy", "beam_search"], ValueError, "--decode_strategy 'beam_search'"),
        (["--chat", "--dtype", "int8"], ValueError, "--dtype 'int8'"),
        (["--chat", "--no_such_flag", "1"], ValueError, "--no_such_flag"),
    ],
)
def test_bad_flags_are_named(tiny_world, flags, error, message):
    with pytest.raises(error, match=message):
        predictor.main(["--model_name_or_path", tiny_world["model"], *flags])


def test_missing_model_folder_is_named():
    with pytest.raises(ValueError, match="--model_name_or_path /no/such/policy"):
        predictor.main(["--model_name_or_path", "/no/such/policy", "--chat"])


def test_a_row_without_src_is_named(tiny_world, tmp_path):
    data_file = str(tmp_path / "bad.jsonl")
    write_rows(data_file, [{"src": "1+2+3=", "tgt": "6"}, {"tgt": "7"}])
    with pytest.raises(ValueError, match=r"bad.jsonl row 2: no prompt; it needs a 'src'"):
        predictor.main(["--model_name_or_path", tiny_world["model"], "--data_file", data_file, "--output_file", str(tmp_path / "out.jsonl")])
