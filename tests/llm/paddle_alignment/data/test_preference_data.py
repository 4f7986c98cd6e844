"""Preference rows as run_dpo and run_kto read them: PaddleNLP's src/tgt/response/sort, TRL's prompt/chosen/rejected
(strings, chat messages, or whole conversations), this project's answer/other_answer/better; PaddleNLP's cut of
over-long rows; and every bad row refused naming its file and line."""

import json
import logging

import pytest

from paddle_alignment.chat_template import render_chat
from paddle_alignment.data.preference import cut_to_fit, fingerprint, preference_pairs, rated_responses
from paddle_alignment.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    return load_tokenizer(tiny_world["model"])


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_paddlenlp_pairs_put_the_higher_sort_first_and_keep_the_conversation(tokenizer, tmp_path):
    eos = tokenizer.eos_token_id
    path = write_rows(tmp_path / "pairs.jsonl", [
        {"src": ["1+2+3=", "4+5+6="], "tgt": ["6"], "response": ["14", "15"], "sort": [0, 1]},
    ])
    (pair,) = preference_pairs(path, tokenizer, 64, 32)
    assert pair.prompt == ids(tokenizer, "1+2+3=") + ids(tokenizer, "6") + [eos] + ids(tokenizer, "4+5+6=")
    assert pair.chosen == ids(tokenizer, "15") + [eos] and pair.rejected == ids(tokenizer, "14") + [eos]
    assert pair.where == f"{path}:1"


def test_trl_and_project_rows_give_the_same_pair(tokenizer, tmp_path):
    rows = [
        {"src": "1+2+3=", "tgt": [], "response": ["6", "7"], "sort": [2, 1]},
        {"prompt": "1+2+3=", "chosen": "6", "rejected": "7"},
        {"src": "1+2+3=", "answer": "7", "other_answer": "6", "better": False},
    ]
    pairs = preference_pairs(write_rows(tmp_path / "rows.jsonl", rows), tokenizer, 64, 32)
    assert len({(tuple(p.prompt), tuple(p.chosen), tuple(p.rejected)) for p in pairs}) == 1


def test_chat_message_rows_render_the_template_and_its_end_of_turn(tokenizer, tmp_path):
    prompt = [{"role": "user", "content": "1+2+3="}]
    rows = [
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": "6"}], "rejected": [{"role": "assistant", "content": "7"}]},
        {"chosen": prompt + [{"role": "assistant", "content": "6"}], "rejected": prompt + [{"role": "assistant", "content": "7"}]},
    ]
    explicit, implicit = preference_pairs(write_rows(tmp_path / "chat.jsonl", rows), tokenizer, 128, 64)
    assert explicit == implicit.__class__(**{**vars(implicit), "where": explicit.where})
    rendered = render_chat(tokenizer, prompt)
    assert explicit.prompt == ids(tokenizer, rendered)
    whole = render_chat(tokenizer, prompt + [{"role": "assistant", "content": "6"}], add_generation_prompt=False)
    assert explicit.chosen == ids(tokenizer, whole[len(rendered):])
    assert tokenizer.decode(explicit.chosen).startswith("6<|im_end|>")


@pytest.mark.parametrize("row, message", [
    ({"src": "1+1=", "tgt": [], "response": ["2"], "sort": [1]}, "must be lists of 2"),
    ({"src": "1+1=", "tgt": [], "response": ["2", "3"], "sort": [1, 1]}, "equal 'sort'"),
    ({"src": ["1+1=", "2+2="], "tgt": [], "response": ["2", "3"], "sort": [1, 0]}, "src needs one more turn than tgt"),
    ({"src": "1+1=", "tgt": [], "response": ["2", ""], "sort": [1, 0]}, "'response' must be a non-empty string"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "the chosen and rejected responses are the same"),
    ({"prompt": "1+1=", "chosen": "2"}, "not a preference pair"),
    ({"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
      "rejected": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}, "differ only in the last turn"),
])
def test_a_bad_pair_row_is_refused_naming_its_file_and_line(tokenizer, tmp_path, row, message):
    path = write_rows(tmp_path / "bad.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, row])
    with pytest.raises(ValueError, match=message) as error:
        preference_pairs(path, tokenizer, 64, 32)
    assert f"{path}:2:" in str(error.value)


@pytest.mark.parametrize("row, message", [
    ({"src": "1+1=", "tgt": [], "response": ["2", "3"], "sort": [1, 0]}, "lists of 1 for KTO"),
    ({"src": "1+1=", "tgt": [], "response": ["2"], "sort": [2]}, r"\[1\] \(desirable\) or \[0\]"),
    ({"prompt": "1+1=", "completion": "2", "label": "yes"}, "'label' must be true or false"),
])
def test_a_bad_kto_row_is_refused_naming_its_file_and_line(tokenizer, tmp_path, row, message):
    path = write_rows(tmp_path / "bad.jsonl", [{"prompt": "1+1=", "completion": "2", "label": True}, row])
    with pytest.raises(ValueError, match=message) as error:
        rated_responses(path, tokenizer, 64, 32)
    assert f"{path}:2:" in str(error.value)


def test_a_missing_data_file_is_named(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl does not exist"):
        preference_pairs(str(tmp_path / "nowhere.jsonl"), tokenizer, 64, 32)


def test_over_long_rows_are_cut_as_paddlenlp_cuts_them_and_counted(tokenizer, tmp_path, caplog):
    prompt, replies = list(range(10)), [list(range(100, 106)), list(range(200, 202))]
    assert cut_to_fit(prompt, replies, 18, 8) == (prompt, replies, False)
    # The prompt keeps its last 4 tokens, then the 6 + 2 reply tokens share the 8 left in proportion: 6 and 2.
    assert cut_to_fit(prompt, replies, 12, 4) == (prompt[-4:], [replies[0][:6], replies[1][:2]], True)
    assert cut_to_fit(prompt, replies, 10, 4) == (prompt[-4:], [replies[0][:4], replies[1][:2]], True)
    long = {"src": "1+2+3=" * 6, "tgt": [], "response": ["6", "7"], "sort": [1, 0]}
    path = write_rows(tmp_path / "long.jsonl", [long, {"src": "1+1=", "tgt": [], "response": ["2", "3"], "sort": [1, 0]}])
    with caplog.at_level(logging.WARNING):
        pairs = preference_pairs(path, tokenizer, 12, 6)
    assert len(pairs[0].prompt) == 6 and "1 of 2 pairs were longer than max_seq_len=12 and were cut" in caplog.text


def test_kto_rows_take_the_next_rows_reply_for_the_kl_baseline(tokenizer, tmp_path):
    rows = [{"src": f"{i}+1=", "tgt": [], "response": [str(i + 1)], "sort": [i % 2]} for i in range(3)]
    rated = rated_responses(write_rows(tmp_path / "kto.jsonl", rows), tokenizer, 64, 32)
    assert [r.desirable for r in rated] == [False, True, False]
    assert [r.kl_response for r in rated] == [rated[1].response, rated[2].response, rated[0].response]


def test_the_fingerprint_follows_the_token_ids_only(tokenizer, tmp_path):
    rows = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, {"prompt": "2+2=", "chosen": "4", "rejected": "5"}]
    first = preference_pairs(write_rows(tmp_path / "a.jsonl", rows), tokenizer, 64, 32)
    same = preference_pairs(write_rows(tmp_path / "b.jsonl", rows), tokenizer, 64, 32)
    changed = preference_pairs(write_rows(tmp_path / "c.jsonl", rows[:1]), tokenizer, 64, 32)
    assert fingerprint(first) == fingerprint(same) != fingerprint(changed)
