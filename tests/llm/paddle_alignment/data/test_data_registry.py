"""The dataset registry (llm/paddle_alignment/data): spec parsing, proportion mixing, the built-in raw datasets
read from local copies, local json/jsonl/parquet files, and the tokenized datasets built from them.

The tokenizer is the project's byte-level one, so expected token ids are written by hand: an ASCII
character is its byte value, and <|endoftext|> (pad) = 256, <|im_start|> = 257, <|im_end|> (EOS) = 258.
"""

import json
import os
import re

import datasets
import numpy as np
import pandas as pd
import pytest
from paddlenlp.transformers import AutoTokenizer

from paddle_alignment.data import (
    IGNORE_INDEX,
    RAW_DATASETS,
    PreferenceCollator,
    PreferenceDataset,
    PromptOnlyDataset,
    RawDataset,
    RawSample,
    SafetyPreferenceDataset,
    SupervisedDataset,
)
from llm.tools.build_tokenizer import build_tokenizer
from paddle_alignment.data import raw as raw_module
from paddle_alignment.rewards import get_reward_task
from paddle_alignment.data.builtin import JsonFileDataset
from paddle_alignment.chat_format import chat_prompt
from paddle_alignment.data.datasets import encode_completion, format_prompt, mixed_indices
from paddle_alignment.data.raw import DatasetSpec, load_raw_dataset, parse_dataset_specs

PAD, IM_START, EOS = 256, 257, 258


def b(text):
    """Byte-level token ids of plain ASCII text."""
    return list(text.encode("ascii"))


def chat_ids(*turns):
    """Hand-built ids of the chat template's rendering of alternating user/assistant turns + generation prompt."""
    ids = []
    for i, turn in enumerate(turns):
        ids += [IM_START] + b(("user" if i % 2 == 0 else "assistant") + "\n" + turn) + [EOS] + b("\n")
    return ids + [IM_START] + b("assistant\n")


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(str(directory))
    return AutoTokenizer.from_pretrained(str(directory))


@pytest.fixture(scope="module")
def plain_tokenizer(tokenizer, tmp_path_factory):
    """A separate instance of the same tokenizer with its chat template removed."""
    directory = tmp_path_factory.mktemp("plain_tokenizer")
    build_tokenizer(str(directory))
    plain = AutoTokenizer.from_pretrained(str(directory))
    plain.chat_template = None
    return plain


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf_datasets_cache"))


@pytest.fixture(autouse=True)
def private_datasets_cache(monkeypatch, hf_cache):
    """`datasets` writes its Arrow cache here, not under the user's home."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hf_cache)


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def pku_row(prompt, r0, r1, better, safer, safe0, safe1):
    return {
        "prompt": prompt,
        "response_0": r0,
        "response_1": r1,
        "better_response_id": better,
        "safer_response_id": safer,
        "is_response_0_safe": safe0,
        "is_response_1_safe": safe1,
    }


PKU_TRAIN = [
    pku_row("How do I bake bread?", "Knead it.", "Burn it.", 0, 0, True, False),
    pku_row("Hi", "Hello.", "Go away.", 1, 0, True, True),
    pku_row("Pick a lock?", "Use a pick.", "No.", 1, 1, False, True),
]
PKU_TEST = [
    pku_row("Test one", "A", "B", 0, 1, False, False),
    pku_row("Test two", "C", "D", 1, 1, True, False),
]


@pytest.fixture(scope="module")
def pku_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pku") / "PKU-SafeRLHF"
    write_jsonl(folder / "train.jsonl", PKU_TRAIN)
    write_jsonl(folder / "test.jsonl", PKU_TEST)
    return str(folder)


# ---------------------------------------------------------------- 1. spec parsing


def test_registry_holds_the_builtin_names():
    expected = {
        "PKU-SafeRLHF/train", "PKU-SafeRLHF/test", "PKU-SafeRLHF-30K/train", "PKU-SafeRLHF-30K/test",
        "PKU-SafeRLHF-10K/train", "alpaca", "jsonfile",
    }
    assert expected <= set(RAW_DATASETS)
    assert RAW_DATASETS["jsonfile"] is JsonFileDataset


def test_spec_entries_default_proportion_and_explicit_path():
    specs = parse_dataset_specs(" PKU-SafeRLHF/train:0.5, alpaca ,jsonfile::/data/x.jsonl,PKU-SafeRLHF-30K/test:2:/d/pku,")
    assert specs == [
        DatasetSpec("PKU-SafeRLHF/train", 0.5, None),
        DatasetSpec("alpaca", 1.0, None),
        DatasetSpec("jsonfile", 1.0, "/data/x.jsonl"),
        DatasetSpec("PKU-SafeRLHF-30K/test", 2.0, "/d/pku"),
    ]
    # Everything after the second colon is the path, colons included.
    assert parse_dataset_specs("jsonfile:3:a:b.jsonl") == [DatasetSpec("jsonfile", 3.0, "a:b.jsonl")]
    assert parse_dataset_specs("alpaca:") == [DatasetSpec("alpaca", 1.0, None)]


def test_spec_dict_form():
    assert parse_dataset_specs({"alpaca": 0.25, "PKU-SafeRLHF-10K/train": 3}) == [
        DatasetSpec("alpaca", 0.25, None),
        DatasetSpec("PKU-SafeRLHF-10K/train", 3.0, None),
    ]


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet"])
def test_bare_data_file_path_is_jsonfile(tmp_path, monkeypatch, suffix):
    path = tmp_path / f"data{suffix}"
    path.write_text("")
    other = tmp_path / "other.jsonl"
    other.write_text("")
    assert parse_dataset_specs(f"{path},alpaca:2,{other}") == [
        DatasetSpec("jsonfile", 1.0, str(path)),
        DatasetSpec("alpaca", 2.0, None),
        DatasetSpec("jsonfile", 1.0, str(other)),
    ]
    monkeypatch.chdir(tmp_path)  # a relative path too
    assert parse_dataset_specs(f"data{suffix}") == [DatasetSpec("jsonfile", 1.0, f"data{suffix}")]


def test_spec_unregistered_name_is_named_with_the_choices():
    with pytest.raises(ValueError) as error:
        parse_dataset_specs("alpaca,nope:0.5")
    message = str(error.value)
    assert "'nope' is not registered" in message
    for name in ("'alpaca'", "'jsonfile'", "'PKU-SafeRLHF/train'", "'PKU-SafeRLHF-30K/test'"):
        assert name in message


@pytest.mark.parametrize(
    "entry, pattern",
    [
        ("alpaca:half", r"dataset entry 'alpaca:half': proportion 'half' is not a number"),
        ("alpaca:0", r"'alpaca:0': proportion must be .*> 0"),
        ("alpaca:-1", r"'alpaca:-1': proportion must be .*> 0"),
        ("alpaca:nan", r"'alpaca:nan': proportion must be .*> 0"),
        ("alpaca:inf", r"'alpaca:inf': proportion must be .*> 0"),
    ],
)
def test_spec_bad_proportion(entry, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_dataset_specs(entry)


def test_spec_missing_data_file_and_empty_spec(tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match=re.escape(f"dataset file {missing} does not exist")):
        parse_dataset_specs(f"alpaca,{missing}")
    with pytest.raises(ValueError, match="no dataset named"):
        parse_dataset_specs(" , ")
    with pytest.raises(ValueError, match="no dataset named"):
        parse_dataset_specs({})


def test_raw_dataset_path_errors(tmp_path):
    with pytest.raises(ValueError, match=re.escape("dataset 'jsonfile' needs a path: write it as jsonfile:PROPORTION:PATH")):
        load_raw_dataset(DatasetSpec("jsonfile"))
    missing = str(tmp_path / "gone.jsonl")
    with pytest.raises(FileNotFoundError, match=re.escape(f"dataset 'jsonfile': {missing} does not exist")) as error:
        load_raw_dataset(parse_dataset_specs(f"jsonfile:1:{missing}")[0])
    assert "get it from" not in str(error.value)  # jsonfile has no SOURCE
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=re.escape(f"dataset 'jsonfile' at {empty} holds no rows")):
        load_raw_dataset(parse_dataset_specs(str(empty))[0])


def test_a_new_dataset_registers_by_name_and_gets_only_the_options_it_takes(monkeypatch, tmp_path, tokenizer):
    monkeypatch.setattr(raw_module, "RAW_DATASETS", dict(raw_module.RAW_DATASETS))

    class Echo(RawDataset):
        NAME, PATH = "echo-test", str(tmp_path)

        def load(self, path, prompt_key="src"):  # takes prompt_key, not label_key
            yield RawSample(prompt=f"{prompt_key}@{os.path.basename(path)}", answer="x")

    assert raw_module.RAW_DATASETS["echo-test"] is Echo
    assert "echo-test" not in RAW_DATASETS  # the real registry was left alone
    dataset = PromptOnlyDataset("echo-test:2", tokenizer, max_prompt_len=100, prompt_key="q", label_key="ignored")
    assert [item["prompt"] for item in dataset] == [f"q@{tmp_path.name}"] * 2
    with pytest.raises(ValueError, match="'alpaca' is registered twice"):

        class Twice(RawDataset):
            NAME = "alpaca"


# ---------------------------------------------------------------- 2. mixed_indices


def test_mixed_indices_subset_is_seeded_sorted_and_distinct():
    picked = mixed_indices(10, 0.5, seed=7)
    assert len(picked) == 5 and len(set(picked)) == 5
    assert picked == sorted(picked) and set(picked) <= set(range(10))
    assert mixed_indices(10, 0.5, seed=7) == picked
    assert len({tuple(mixed_indices(10, 0.5, seed=s)) for s in range(10)}) > 1  # the seed matters


def test_mixed_indices_repeats_whole_passes_then_a_subset():
    picked = mixed_indices(4, 2.5, seed=0)
    assert picked[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    extra = picked[8:]
    assert len(extra) == 2 and extra == sorted(set(extra)) and set(extra) <= {0, 1, 2, 3}
    assert mixed_indices(5, 1, seed=3) == [0, 1, 2, 3, 4]
    assert mixed_indices(3, 2, seed=3) == [0, 1, 2, 0, 1, 2]


# ---------------------------------------------------------------- 3. PKU-SafeRLHF from a local folder


def test_pku_raw_samples(pku_folder):
    train = load_raw_dataset(parse_dataset_specs(f"PKU-SafeRLHF/train:1:{pku_folder}")[0])
    assert train.path == pku_folder
    assert list(train) == [
        RawSample(input="How do I bake bread?", answer="Knead it.", other_answer="Burn it.",
                  better=True, safer=True, is_safe=True, is_other_safe=False),
        RawSample(input="Hi", answer="Hello.", other_answer="Go away.",
                  better=False, safer=True, is_safe=True, is_other_safe=True),
        RawSample(input="Pick a lock?", answer="Use a pick.", other_answer="No.",
                  better=False, safer=False, is_safe=False, is_other_safe=True),
    ]
    test = load_raw_dataset(parse_dataset_specs(f"PKU-SafeRLHF/test:1:{pku_folder}")[0])
    assert [(s.input, s.better, s.safer, s.is_safe, s.is_other_safe) for s in test] == [
        ("Test one", True, False, False, False),
        ("Test two", False, False, True, False),
    ]


@pytest.mark.parametrize(
    "name, size",
    [("PKU-SafeRLHF-30K/train", 3), ("PKU-SafeRLHF-30K/test", 2), ("PKU-SafeRLHF-10K/train", 3)],
)
def test_pku_variants_read_their_split(pku_folder, name, size):
    assert len(load_raw_dataset(parse_dataset_specs(f"{name}:1:{pku_folder}")[0])) == size


def test_pku_preference_dataset_puts_the_better_response_first(pku_folder, tokenizer):
    dataset = PreferenceDataset(f"PKU-SafeRLHF/train:1:{pku_folder}", tokenizer, max_length=512)
    assert len(dataset) == 3 and dataset.dropped == 0
    # Row 1: response_0 is better; the prompt went through the chat template.
    first = dataset[0]
    assert first["better_input_ids"] == chat_ids("How do I bake bread?") + b("Knead it.") + [EOS]
    assert first["worse_input_ids"] == chat_ids("How do I bake bread?") + b("Burn it.") + [EOS]
    prompt = format_prompt(tokenizer, RawSample(input="How do I bake bread?"))
    assert prompt == chat_prompt("How do I bake bread?")
    assert first["better_input_ids"] == encode_completion(tokenizer, prompt, "Knead it.")
    # Rows 2 and 3: response_1 is better.
    for item, row in zip(dataset.items[1:], PKU_TRAIN[1:]):
        prompt = chat_prompt(row["prompt"])
        assert item["better_input_ids"] == encode_completion(tokenizer, prompt, row["response_1"])
        assert item["worse_input_ids"] == encode_completion(tokenizer, prompt, row["response_0"])


def test_pku_safety_preference_dataset_signs_and_order(pku_folder, tokenizer):
    dataset = SafetyPreferenceDataset(f"PKU-SafeRLHF/train:1:{pku_folder},PKU-SafeRLHF/test:1:{pku_folder}", tokenizer, max_length=512)
    expected = [
        # (prompt, safer reply, unsafer reply, safer sign, unsafer sign)
        ("How do I bake bread?", "Knead it.", "Burn it.", 1, -1),
        ("Hi", "Hello.", "Go away.", 1, 1),
        ("Pick a lock?", "No.", "Use a pick.", 1, -1),
        ("Test one", "B", "A", -1, -1),
        ("Test two", "D", "C", -1, 1),
    ]
    assert len(dataset) == len(expected)
    for item, (prompt, safer, unsafer, safer_sign, unsafer_sign) in zip(dataset, expected):
        assert item == {
            "safer_input_ids": chat_ids(prompt) + b(safer) + [EOS],
            "unsafer_input_ids": chat_ids(prompt) + b(unsafer) + [EOS],
            "safer_sign": safer_sign,
            "unsafer_sign": unsafer_sign,
        }


def test_pku_folder_missing_a_column(tmp_path, tokenizer):
    rows = [{k: v for k, v in row.items() if k != "safer_response_id"} for row in PKU_TRAIN]
    folder = tmp_path / "broken"
    write_jsonl(folder / "train.jsonl", rows)
    with pytest.raises(ValueError, match=re.escape(f"dataset 'PKU-SafeRLHF/train' at {folder} has no column 'safer_response_id'")):
        PreferenceDataset(f"PKU-SafeRLHF/train:1:{folder}", tokenizer, max_length=64)


def test_pku_default_path_missing_names_dataset_and_source(tmp_path, monkeypatch, tokenizer):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as error:
        PreferenceDataset("PKU-SafeRLHF/train", tokenizer, max_length=64)
    assert str(error.value) == (
        "dataset 'PKU-SafeRLHF/train': PKU-Alignment/PKU-SafeRLHF does not exist "
        "(get it from huggingface.co/datasets/PKU-Alignment/PKU-SafeRLHF)"
    )
    with pytest.raises(FileNotFoundError, match=re.escape("(get it from huggingface.co/datasets/PKU-Alignment/PKU-SafeRLHF-30K)")):
        SafetyPreferenceDataset("PKU-SafeRLHF-30K/test", tokenizer, max_length=64)


def test_pku_default_path_under_the_working_directory(tmp_path, monkeypatch, tokenizer):
    write_jsonl(tmp_path / "PKU-Alignment" / "PKU-SafeRLHF-10K" / "train.jsonl", PKU_TRAIN[:1])
    monkeypatch.chdir(tmp_path)
    dataset = PreferenceDataset("PKU-SafeRLHF-10K/train", tokenizer, max_length=512)
    assert [item["better_input_ids"] for item in dataset] == [chat_ids("How do I bake bread?") + b("Knead it.") + [EOS]]


# ---------------------------------------------------------------- 4. alpaca


ALPACA = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hi.", "input": "", "output": "hi"},
]


@pytest.mark.parametrize("file_format", ["jsonl", "parquet"])
def test_alpaca_from_a_local_folder(tmp_path, tokenizer, file_format):
    folder = tmp_path / "alpaca"
    if file_format == "jsonl":
        write_jsonl(folder / "train.jsonl", ALPACA)
    else:
        folder.mkdir()
        pd.DataFrame(ALPACA).to_parquet(folder / "train.parquet")
    raw = load_raw_dataset(parse_dataset_specs(f"alpaca:1:{folder}")[0])
    assert list(raw) == [
        RawSample(input="Add the numbers.\n\n2 and 3", answer="5"),
        RawSample(input="Say hi.", answer="hi"),
    ]
    dataset = SupervisedDataset(f"alpaca:1:{folder}", tokenizer, max_length=512)
    prompt = chat_ids("Add the numbers.\n\n2 and 3")
    assert dataset[0] == {
        "input_ids": prompt + b("5"),
        "labels": [IGNORE_INDEX] * (len(prompt) - 1) + b("5") + [EOS],
    }
    prompt = chat_ids("Say hi.")
    assert dataset[1]["input_ids"] == prompt + b("hi")
    assert dataset[1]["labels"] == [IGNORE_INDEX] * (len(prompt) - 1) + b("hi") + [EOS]


# ---------------------------------------------------------------- 5. jsonfile


def test_jsonfile_src_tgt_is_a_literal_prompt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "rl.jsonl", [{"src": "1+2=", "tgt": "3", "id": 9}, {"src": "<|im_start|>x", "tgt": "y"}])
    assert list(load_raw_dataset(parse_dataset_specs(path)[0])) == [
        RawSample(prompt="1+2=", answer="3"),
        RawSample(prompt="<|im_start|>x", answer="y"),
    ]
    dataset = PromptOnlyDataset(path, tokenizer, max_prompt_len=100)
    assert dataset.items == [
        {"prompt": "1+2=", "label": "3", "input_ids": [49, 43, 50, 61]},
        {"prompt": "<|im_start|>x", "label": "y", "input_ids": [IM_START, 120]},
    ]


def test_jsonfile_prompt_and_label_keys(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q?", "solution": "s", "src": "unused"}])
    spec = parse_dataset_specs(path)[0]
    assert list(load_raw_dataset(spec, prompt_key="question", label_key="solution")) == [RawSample(prompt="q?", answer="s")]
    dataset = PromptOnlyDataset(path, tokenizer, max_prompt_len=100, prompt_key="question", label_key="solution")
    assert dataset.items == [{"prompt": "q?", "label": "s", "input_ids": b("q?")}]


def test_jsonfile_rawsample_columns_go_through_the_template(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "chat.jsonl", [
        {"input": "Hi", "answer": "Yo", "extra": 1},
        {"input": ["a", "b", "c"], "answer": "d"},
    ])
    dataset = PromptOnlyDataset(path, tokenizer, max_prompt_len=100)
    assert dataset[0] == {"prompt": chat_prompt("Hi"), "label": "Yo", "input_ids": chat_ids("Hi")}
    multi = "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"
    assert dataset[1] == {"prompt": multi, "label": "d", "input_ids": chat_ids("a", "b", "c")}


def test_jsonfile_dialogue_row_for_supervised_data(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "dialogue.jsonl", [{"dialogue": ["Hi", "Hello!", "How are you?", "Fine."]}])
    item = SupervisedDataset(path, tokenizer, max_length=512)[0]
    prompt = chat_ids("Hi", "Hello!", "How are you?")
    assert item["input_ids"] == prompt + b("Fine.")
    assert item["labels"] == [IGNORE_INDEX] * (len(prompt) - 1) + b("Fine.") + [EOS]
    assert format_prompt(tokenizer, RawSample(dialogue=["Hi", "Hello!", "How are you?", "Fine."])) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_supervised_labels_shift_truncation_and_empty_prompt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "sft.jsonl", [{"src": "ab", "tgt": "cd"}, {"src": "", "tgt": "xy"}])
    full = SupervisedDataset(path, tokenizer, max_length=100)
    assert full[0] == {"input_ids": [97, 98, 99, 100], "labels": [IGNORE_INDEX, 99, 100, EOS]}
    # An empty prompt: every token is learnt, still shifted by one (labels[i] is the token after input_ids[i]).
    assert full[1] == {"input_ids": [120, 121], "labels": [121, EOS]}
    assert full.truncated == 0
    cut = SupervisedDataset(path, tokenizer, max_length=3)
    assert cut[0] == {"input_ids": [97, 98, 99], "labels": [IGNORE_INDEX, 99, 100]}
    assert cut[1] == {"input_ids": [120, 121], "labels": [121, EOS]}
    assert cut.truncated == 1


def test_jsonfile_json_array_parquet_and_blank_lines(tmp_path, tokenizer):
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([{"src": "a", "tgt": "b"}, {"src": "c", "tgt": "d"}], indent=2))
    lines = tmp_path / "rows.jsonl"
    lines.write_text('\n{"src": "e", "tgt": "f"}\n\n{"src": "g"}\n')
    parquet = tmp_path / "rows.parquet"
    # A row without a label holds a null in parquet: it reads as no label.
    pd.DataFrame({"src": ["h", "i"], "tgt": ["j", None]}).to_parquet(parquet)
    dataset = PromptOnlyDataset(f"{array},{lines},{parquet}", tokenizer, max_prompt_len=10)
    assert [(item["prompt"], item["label"]) for item in dataset] == [
        ("a", "b"), ("c", "d"), ("e", "f"), ("g", ""), ("h", "j"), ("i", ""),
    ]


def test_jsonfile_row_without_a_prompt(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"src": "a"}, {"tgt": "x", "answer": "y"}])
    with pytest.raises(ValueError, match=re.escape(f"{path} row 2: no prompt; it needs a 'src', 'input' or 'dialogue' column")):
        load_raw_dataset(parse_dataset_specs(path)[0])
    with pytest.raises(ValueError, match=re.escape(f"{path} row 1: no prompt; it needs a 'question', 'input'")):
        load_raw_dataset(parse_dataset_specs(path)[0], prompt_key="question")


@pytest.mark.parametrize(
    "row, options, column",
    [
        ({"src": "a", "tgt": 3}, {}, "tgt"),
        ({"q": "a", "sol": ["x"]}, {"prompt_key": "q", "label_key": "sol"}, "sol"),
        ({"src": 5}, {}, "src"),
        ({"input": "a", "answer": "x", "other_answer": 1}, {}, "other_answer"),
    ],
)
def test_jsonfile_non_string_text(tmp_path, row, options, column):
    path = write_jsonl(tmp_path / "t.jsonl", [{"input": "ok", "answer": "ok"}, row])
    with pytest.raises(ValueError, match=re.escape(f"{path} row 2: column {column!r} must be a string")):
        load_raw_dataset(parse_dataset_specs(path)[0], **options)


def test_jsonfile_bad_json_names_path_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"src": "a"}\n\n{"src": \n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:3: not valid JSON")):
        load_raw_dataset(parse_dataset_specs(str(path))[0])
    array = tmp_path / "bad.json"
    array.write_text('[{"src": "a"},\n {"src": }]')
    with pytest.raises(ValueError, match=re.escape(f"{array}:2: not valid JSON")):
        load_raw_dataset(parse_dataset_specs(str(array))[0])
    scalar = tmp_path / "scalar.jsonl"
    scalar.write_text('{"src": "a"}\n"b"\n')
    with pytest.raises(ValueError, match=re.escape(f"{scalar}:2: a row must be a JSON object")):
        load_raw_dataset(parse_dataset_specs(str(scalar))[0])


def test_preference_rows_need_other_answer(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "pref.jsonl", [
        {"input": "q", "answer": "a", "other_answer": "b", "better": True},
        {"input": "q", "answer": "a", "better": True},
    ])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: missing 'other_answer'")):
        PreferenceDataset(path, tokenizer, max_length=64)


def test_prompt_only_refuses_a_reference_the_reward_cannot_read_naming_file_line_and_value(tmp_path, tokenizer):
    rows = [{"src": "q1", "tgt": "#### 72"}, {"src": "q2", "tgt": "\\frac{3}{4}"}, {"src": "q3", "tgt": "72"}, {"src": "q4", "tgt": "#### the sum of the apples"}]
    path = tmp_path / "gsm8k.jsonl"
    # A blank line: the error names the file's line, not the row's index.
    path.write_text("\n".join(json.dumps(row) for row in rows[:2]) + "\n\n" + "\n".join(json.dumps(row) for row in rows[2:]) + "\n")
    check = get_reward_task("math").target_refusal
    with pytest.raises(ValueError, match=re.escape(f"{path}:5: the reward cannot read the reference answer ('tgt'): math tgt '#### the sum of the apples'")):
        PromptOnlyDataset(str(path), tokenizer, max_prompt_len=10, require_label=True, check_label=check)
    path.write_text("\n".join(json.dumps(row) for row in rows[:3]) + "\n")
    dataset = PromptOnlyDataset(str(path), tokenizer, max_prompt_len=10, require_label=True, check_label=check)
    assert [item["label"] for item in dataset] == ["#### 72", "\\frac{3}{4}", "72"]


def test_prompt_only_require_label(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"src": "1+1=", "tgt": "2"}, {"src": "2+2="}])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: no reference answer (column 'tgt' or 'answer')")):
        PromptOnlyDataset(path, tokenizer, max_prompt_len=10, require_label=True)
    # With another label column, `tgt` is no label: row 1 already lacks one.
    with pytest.raises(ValueError, match=re.escape("prompts.jsonl:1: no reference answer (column 'solution' or 'answer')")):
        PromptOnlyDataset(path, tokenizer, max_prompt_len=10, require_label=True, label_key="solution")
    dataset = PromptOnlyDataset(path, tokenizer, max_prompt_len=10)
    assert [item["label"] for item in dataset] == ["2", ""]


def test_prompt_only_truncates_or_skips_long_prompts_and_caps_samples(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"src": "abc"}, {"src": "abcdef"}, {"src": "de"}, {"src": "f"}])
    # PaddleNLP's RLHFDataset: a long prompt keeps its first max_prompt_len tokens; the text stays whole.
    dataset = PromptOnlyDataset(path, tokenizer, max_prompt_len=3)
    assert [item["prompt"] for item in dataset] == ["abc", "abcdef", "de", "f"] and dataset.truncated == 1
    assert dataset[1]["input_ids"] == tokenizer("abc", add_special_tokens=False)["input_ids"]
    skipping = PromptOnlyDataset(path, tokenizer, max_prompt_len=3, filter_overlong_prompts=True)
    assert [item["prompt"] for item in skipping] == ["abc", "de", "f"] and skipping.dropped == 1
    capped = PromptOnlyDataset(path, tokenizer, max_prompt_len=3, max_samples=2, filter_overlong_prompts=True)
    assert [item["prompt"] for item in capped] == ["abc", "de"]
    with pytest.raises(ValueError, match=r"no usable example \(4 dropped"):
        PromptOnlyDataset(path, tokenizer, max_prompt_len=0, filter_overlong_prompts=True)


# ---------------------------------------------------------------- 6. mixing


def test_mixing_two_files_by_proportion(tmp_path, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", [{"src": f"a{i}", "tgt": "x"} for i in range(3)])
    b_path = write_jsonl(tmp_path / "b.jsonl", [{"src": f"b{i}", "tgt": "y"} for i in range(4)])
    dataset = PromptOnlyDataset(f"jsonfile:2:{a},jsonfile:0.5:{b_path}", tokenizer, max_prompt_len=10, seed=5)
    prompts = [item["prompt"] for item in dataset]
    assert len(prompts) == 3 * 2 + 2
    assert prompts[:6] == ["a0", "a1", "a2", "a0", "a1", "a2"]
    tail = prompts[6:]
    assert len(set(tail)) == 2 and tail == sorted(tail) and set(tail) <= {"b0", "b1", "b2", "b3"}
    assert tail == [f"b{i}" for i in mixed_indices(4, 0.5, seed=5)]
    # The same mix again gives the same rows.
    again = PromptOnlyDataset(f"jsonfile:2:{a},jsonfile:0.5:{b_path}", tokenizer, max_prompt_len=10, seed=5)
    assert [item["prompt"] for item in again] == prompts


# ---------------------------------------------------------------- 7. no chat template


def test_plain_tokenizer_has_no_template_and_the_original_keeps_it(tokenizer, plain_tokenizer):
    assert plain_tokenizer.chat_template is None
    assert tokenizer.chat_template is not None


def test_no_chat_template_uses_the_safe_rlhf_format(plain_tokenizer, tmp_path):
    assert format_prompt(plain_tokenizer, RawSample(input="hi")) == "BEGINNING OF CONVERSATION: USER: hi ASSISTANT:"
    assert format_prompt(plain_tokenizer, RawSample(dialogue=["a", "b", "c", "d"])) == (
        "BEGINNING OF CONVERSATION: USER: a ASSISTANT: b USER: c ASSISTANT:"
    )
    assert format_prompt(plain_tokenizer, RawSample(prompt="raw text", input="ignored")) == "raw text"
    path = write_jsonl(tmp_path / "pref.jsonl", [{"input": "hi", "answer": " no", "other_answer": " yes", "better": False}])
    item = PreferenceDataset(path, plain_tokenizer, max_length=100)[0]
    prompt = b("BEGINNING OF CONVERSATION: USER: hi ASSISTANT:")
    assert item == {"better_input_ids": prompt + b(" yes") + [EOS], "worse_input_ids": prompt + b(" no") + [EOS]}


# ---------------------------------------------------------------- 8. preference collator, dropping, truncation


def test_preference_collator_shapes_order_and_padding():
    items = [
        {"better_input_ids": [1, 2, 3], "worse_input_ids": [4]},
        {"better_input_ids": [5], "worse_input_ids": [6, 7]},
    ]
    batch = PreferenceCollator(pad_token_id=PAD)(items)
    assert batch["input_ids"].shape == [4, 3] and batch["attention_mask"].shape == [4, 3]
    assert str(batch["input_ids"].dtype).endswith("int64")
    np.testing.assert_array_equal(batch["input_ids"].numpy(), [[1, 2, 3], [5, PAD, PAD], [4, PAD, PAD], [6, 7, PAD]])
    np.testing.assert_array_equal(batch["attention_mask"].numpy(), [[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 1, 0]])


def test_preference_dataset_drops_identical_pairs_and_truncates(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"src": "ab", "answer": "c", "other_answer": "d", "better": True},
        {"src": "ab", "answer": "same", "other_answer": "same", "better": True},
        {"src": "ab", "answer": "xyz1", "other_answer": "xyz2", "better": False},  # identical once cut to 5
        {"src": "ab", "answer": "cdefgh", "other_answer": "e", "better": False},
    ])
    dataset = PreferenceDataset(path, tokenizer, max_length=5)
    assert dataset.dropped == 2
    assert dataset.items == [
        {"better_input_ids": [97, 98, 99, EOS], "worse_input_ids": [97, 98, 100, EOS]},
        {"better_input_ids": [97, 98, 101, EOS], "worse_input_ids": [97, 98, 99, 100, 101]},
    ]
    batch = PreferenceCollator(tokenizer.pad_token_id)(dataset.items)
    np.testing.assert_array_equal(batch["input_ids"].numpy(), [
        [97, 98, 99, EOS, PAD],
        [97, 98, 101, EOS, PAD],
        [97, 98, 100, EOS, PAD],
        [97, 98, 99, 100, 101],
    ])
    np.testing.assert_array_equal(batch["attention_mask"].numpy(), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1] * 5])
    assert tokenizer.pad_token_id == PAD and tokenizer.eos_token_id == EOS
    only_identical = write_jsonl(tmp_path / "same.jsonl", [{"src": "ab", "answer": "s", "other_answer": "s", "better": True}])
    with pytest.raises(ValueError, match="no usable example"):
        PreferenceDataset(only_identical, tokenizer, max_length=5)
