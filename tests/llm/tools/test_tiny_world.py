"""The embedded tiny world: tokenizer, model builder, demo data, SFT data and the rollout output contract."""

import json
import os
import random

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer

from llm.tools.gen_arith import careless_answer
from paddle_alignment.data import PromptOnlyDataset, SupervisedDataset
from paddle_alignment.chat_format import chat_prompt
from paddle_alignment.rollout.decode import SamplingConfig, generate_rollouts, response_mask_from_tokens


def test_tokenizer_round_trips_text_and_chat_format(tiny_world):
    tokenizer = AutoTokenizer.from_pretrained(tiny_world["model"])
    text = chat_prompt("Zoë says 3+4+1= ?\n  spaced , kept", system="be brief", assistant_prefix="<think>")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text
    special = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert special == [256, 257, 258] and ids.count(257) == 3 and ids.count(258) == 2
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Zoë says 3+4+1= ?\n  spaced , kept"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered + "<think>" == text


def test_tiny_model_loads_with_from_pretrained(tiny_world):
    model = AutoModelForCausalLM.from_pretrained(tiny_world["random_model"])
    assert model.config.vocab_size == 259 and model.config.num_hidden_layers == 2
    logits = model(input_ids=paddle.to_tensor([[1, 2, 3]]), attention_mask=paddle.ones([1, 3], "int64"), return_dict=True).logits
    assert logits.shape == [1, 3, 259]


def test_demo_data_splits_are_disjoint_and_correct(tiny_world):
    def rows(path):
        return [json.loads(line) for line in open(path)]

    train, evaluation = rows(tiny_world["train"]), rows(tiny_world["eval"])
    assert len(train) + len(evaluation) == 1000 and not {r["src"] for r in train} & {r["src"] for r in evaluation}
    for row in train + evaluation:
        a, b, c = map(int, row["src"].rstrip("=").split("+"))
        assert int(row["tgt"]) == a + b + c
    sft_prompts = {r["src"] for r in rows(os.path.join(os.path.dirname(tiny_world["train"]), "..", "sft", "train.json"))}
    assert not sft_prompts & {r["src"] for r in evaluation}


def test_careless_annotator_rates():
    rng = random.Random(0)
    answers = [careless_answer(13, carry_slip_rate=0.6, error_rate=0.1, rng=rng) for _ in range(20000)]
    assert abs(answers.count(3) / 20000 - 0.6) < 0.02
    assert abs(answers.count(13) / 20000 - 0.4 * 0.9) < 0.02
    assert set(answers) == {3, 12, 13, 14}
    assert {careless_answer(7, 0.6, 0.0, rng) for _ in range(100)} == {7}


def test_supervised_dataset_puts_the_loss_on_target_and_eos_only(tiny_world, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_world["model"])
    path = tmp_path / "sft.json"
    path.write_text(json.dumps({"src": "1+2+3=", "tgt": "6"}) + "\n")
    item = SupervisedDataset(str(path), tokenizer, max_length=32)[0]
    tokens = tokenizer("1+2+3=6", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert item["input_ids"] == tokens[:-1]
    # labels[i] is the token after input_ids[i]: only "6" and EOS are learnt.
    assert item["labels"] == [-100] * 5 + [tokens[-2], tokens[-1]]


def test_prompt_dataset_truncates_long_prompts_and_names_bad_rows(tiny_world, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_world["model"])
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"src": "1+2=", "tgt": "3"}\n{"src": "' + "9" * 40 + '", "tgt": "1"}\n')
    dataset = PromptOnlyDataset(str(path), tokenizer, max_prompt_len=8)
    assert len(dataset) == 2 and dataset[0]["label"] == "3" and len(dataset[1]["input_ids"]) == 8
    assert len(PromptOnlyDataset(str(path), tokenizer, max_prompt_len=8, filter_overlong_prompts=True)) == 1
    path.write_text('{"src": "1+2=", "tgt": "3"}\n{"src": "1+2="}\n')
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: no reference answer \(column 'tgt'"):
        PromptOnlyDataset(str(path), tokenizer, max_prompt_len=8, require_label=True)
    # A reward model needs no reference answer.
    assert PromptOnlyDataset(str(path), tokenizer, max_prompt_len=8)[1]["label"] == ""


def test_response_mask_stops_after_the_first_eos():
    eos = 9
    tokens = paddle.to_tensor([[1, 9, 4, 9], [2, 3, 4, 5], [9, 9, 9, 9]])
    mask, finished = response_mask_from_tokens(tokens, eos)
    np.testing.assert_array_equal(mask.numpy(), [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    np.testing.assert_array_equal(finished.numpy(), [True, False, True])


def test_rollouts_follow_the_output_contract(tiny_world):
    tokenizer = AutoTokenizer.from_pretrained(tiny_world["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    prompts = ["1+2+3=", "9+9+9=", "0+0+1="]
    items = [{"prompt": p, "label": "0", "input_ids": tokenizer(p)["input_ids"]} for p in prompts]
    paddle.seed(3)
    exp = generate_rollouts(model, tokenizer, items, n=4, sampling=SamplingConfig(max_dec_len=5))
    assert exp.input_ids.shape[0] == 12 and exp.response_mask.shape == [12, exp.input_ids.shape[1] - exp.prompt_len]
    np.testing.assert_array_equal(exp.group_index.numpy(), np.repeat(np.arange(3), 4))
    assert exp.prompts == [p for p in prompts for _ in range(4)]
    response_ids = exp.input_ids[:, exp.prompt_len:].numpy()
    mask = exp.response_mask.numpy()
    for row in range(12):
        length = int(mask[row].sum())
        assert (response_ids[row, length:] == tokenizer.pad_token_id).all()
        text = tokenizer.decode(response_ids[row, :length], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert exp.responses[row] == text
        assert bool(exp.finished[row]) == (tokenizer.eos_token_id in response_ids[row, :length].tolist())
    np.testing.assert_array_equal(exp.attention_mask.numpy()[:, exp.prompt_len:], mask)
