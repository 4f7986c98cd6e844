"""The fast decode loop (static KV cache + paddlenlp_ops) against paddlenlp generate() and the model."""

import json
import logging
import sys
import types

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from helpers import built_paddlenlp_ops
from paddle_alignment import custom_ops
from paddle_alignment.models.fused_kernels import attention_ops, fused_ops
from paddle_alignment.models.native_forward import SWITCH as NATIVE_SWITCH, native_ops
from paddle_alignment.rollout import decode as infer_utils
from paddle_alignment.rollout.decode import SamplingConfig, generate_rollouts
from paddle_alignment.tokens import left_pad


@pytest.fixture(scope="module")
def ops():
    return built_paddlenlp_ops()


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    return AutoTokenizer.from_pretrained(tiny_world["model"])


def prompt_items(tokenizer, prompts):
    return [{"prompt": p, "label": "0", "input_ids": tokenizer(p)["input_ids"]} for p in prompts]


def eval_items(tiny_world, tokenizer, count):
    rows = [json.loads(line) for line in open(tiny_world["eval"])][:count]
    return [{"prompt": r["src"], "label": r["tgt"], "input_ids": tokenizer(r["src"])["input_ids"]} for r in rows]


@pytest.mark.parametrize("which, min_dec_len", [("model", 0), ("random_model", 24)])
def test_greedy_fast_path_matches_generate_token_for_token(ops, tiny_world, tokenizer, which, min_dec_len):
    # The SFT model answers in a few tokens; the random model is forced to write 24 or more.
    model = AutoModelForCausalLM.from_pretrained(tiny_world[which])
    assert infer_utils.fast_path_ops(model, use_fast=True) is not None  # the comparison is not generate vs itself
    items = eval_items(tiny_world, tokenizer, 12) + prompt_items(tokenizer, ["12+3+45=", "9+", "1+2+3+4+5+6="])
    greedy = SamplingConfig(max_dec_len=32, min_dec_len=min_dec_len, greedy=True)
    fast = generate_rollouts(model, tokenizer, items, 1, greedy, use_fast=True)
    slow = generate_rollouts(model, tokenizer, items, 1, greedy, use_fast=False)
    assert fast.input_ids.shape[1] > fast.prompt_len + min_dec_len - 1
    np.testing.assert_array_equal(fast.input_ids.numpy(), slow.input_ids.numpy())
    np.testing.assert_array_equal(fast.response_mask.numpy(), slow.response_mask.numpy())
    assert fast.responses == slow.responses


def test_greedy_fast_path_matches_generate_on_a_tiny_llama(ops, tiny_world, tokenizer, tmp_path):
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id,
    )
    paddle.seed(0)
    LlamaForCausalLM(config).save_pretrained(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert type(model).__name__ == "LlamaForCausalLM" and infer_utils.fast_path_ops(model, use_fast=True) is not None
    items = eval_items(tiny_world, tokenizer, 6) + prompt_items(tokenizer, ["12+3+45=", "9+"])
    greedy = SamplingConfig(max_dec_len=20, min_dec_len=20, greedy=True)
    fast = generate_rollouts(model, tokenizer, items, 1, greedy, use_fast=True)
    slow = generate_rollouts(model, tokenizer, items, 1, greedy, use_fast=False)
    assert fast.response_mask.shape[1] == 20
    np.testing.assert_array_equal(fast.input_ids.numpy(), slow.input_ids.numpy())


def test_fast_sampling_frequencies_match_the_model(ops, tiny_world, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    model.eval()
    prompt = "4+5+7="
    ids = tokenizer(prompt)["input_ids"]
    with paddle.no_grad():
        inputs = {"input_ids": paddle.to_tensor([ids]), "attention_mask": paddle.ones([1, len(ids)], "int64")}
        logits = model(**inputs, return_dict=True).logits
    probs = paddle.nn.functional.softmax(logits[0, -1].astype("float32")).numpy().astype(np.float64)
    draws = 3000
    paddle.seed(11)
    exp = generate_rollouts(model, tokenizer, prompt_items(tokenizer, [prompt]), draws, SamplingConfig(max_dec_len=1))
    first_tokens = exp.input_ids[:, exp.prompt_len].numpy()
    # Chi-square over tokens expected at least 5 times, the rest pooled into one bin.
    expected, observed = probs * draws, np.bincount(first_tokens, minlength=len(probs))
    common = expected >= 5
    assert common.sum() >= 2, "the prompt should leave the model uncertain between several tokens"
    bins_expected = np.append(expected[common], expected[~common].sum())
    bins_observed = np.append(observed[common], observed[~common].sum())
    chi2 = ((bins_observed - bins_expected) ** 2 / np.maximum(bins_expected, 1e-9)).sum()
    critical = {2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59}
    assert chi2 < critical[min(len(bins_expected) - 1, 10)], (chi2, bins_observed, bins_expected)


def test_fast_rollouts_are_reproducible_with_the_seed(ops, tiny_world, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    items = eval_items(tiny_world, tokenizer, 8)
    sampling = SamplingConfig(max_dec_len=6, temperature=1.2, top_p=0.95)
    paddle.seed(5)
    first = generate_rollouts(model, tokenizer, items, 4, sampling).input_ids.numpy()
    paddle.seed(5)
    np.testing.assert_array_equal(first, generate_rollouts(model, tokenizer, items, 4, sampling).input_ids.numpy())


@pytest.mark.parametrize("native", ["on", "off"])
def test_a_prompt_prefilled_once_samples_as_its_repeated_rows(ops, tiny_world, tokenizer, monkeypatch, native):
    """Each prompt's cache, prefilled once and repeated for its `copies` rows, samples the tokens and records
    the log-probs that prefilling every row gives (native forward and eager decoder)."""
    monkeypatch.setenv(NATIVE_SWITCH, native)
    model = AutoModelForCausalLM.from_pretrained(tiny_world["random_model"])
    model.eval()
    items = eval_items(tiny_world, tokenizer, 3) + prompt_items(tokenizer, ["9+", "1+2+3+4+5+6="])  # padded unequally
    prompts, mask = left_pad([item["input_ids"] for item in items], tokenizer.pad_token_id)
    sampling = SamplingConfig(max_dec_len=7, temperature=1.3)
    with paddle.no_grad():
        shared = infer_utils.decode_with_ops(ops, model, tokenizer, prompts, mask, sampling, 3, copies=4)
        rows, row_mask = (paddle.repeat_interleave(t, 4, axis=0) for t in (prompts, mask))
        each = infer_utils.decode_with_ops(ops, model, tokenizer, rows, row_mask, sampling, 3)
    assert shared[0].shape == [20, 7]
    np.testing.assert_array_equal(shared[0].numpy(), each[0].numpy())
    np.testing.assert_allclose(shared[1].numpy(), each[1].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("native", ["on", "off"])
def test_dropping_finished_rows_changes_no_token_and_no_logprob(ops, tiny_world, tokenizer, monkeypatch, native):
    """The trained model's sampled answers end at different steps: the loop drops finished rows from the batch
    (and their cache), and every row still samples and records what it would have in the whole batch."""
    monkeypatch.setenv(NATIVE_SWITCH, native)
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    model.eval()
    items = eval_items(tiny_world, tokenizer, 6)
    prompts, mask = left_pad([item["input_ids"] for item in items], tokenizer.pad_token_id)
    sampling = SamplingConfig(max_dec_len=24, temperature=1.5)
    drops = []
    drop = infer_utils.RunningRows.drop_finished
    monkeypatch.setattr(infer_utils.RunningRows, "drop_finished", lambda self, out: drops.append(len(self)) or drop(self, out))
    with paddle.no_grad():
        dropping = infer_utils.decode_with_ops(ops, model, tokenizer, prompts, mask, sampling, 11, copies=4)
        monkeypatch.setattr(infer_utils.RunningRows, "finished_enough", lambda self: False)
        whole = infer_utils.decode_with_ops(ops, model, tokenizer, prompts, mask, sampling, 11, copies=4)
    assert len(drops) >= 2 and drops[0] == 24  # rows were dropped, more than once
    lengths = (whole[0] == tokenizer.eos_token_id).astype("int64").argmax(axis=1).numpy()
    assert len(set(lengths.tolist())) >= 3  # the rows ended at different steps
    np.testing.assert_array_equal(dropping[0].numpy(), whole[0].numpy())
    # (a finished row's later steps are padding, with no log-prob once it is dropped)
    mask = infer_utils.response_mask_from_tokens(whole[0], tokenizer.eos_token_id)[0].numpy()
    np.testing.assert_allclose(dropping[1].numpy() * mask, whole[1].numpy() * mask, rtol=1e-5, atol=1e-6)


class CountingPenalties:
    """The rollout ops, counting the calls of rollout_token_penalty."""

    def __init__(self, ops):
        self.ops, self.penalty_calls = ops, 0

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def rollout_token_penalty(self, *args):
        self.penalty_calls += 1
        return self.ops.rollout_token_penalty(*args)


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_the_penalty_op_runs_only_on_steps_it_can_change(ops, tiny_world, tokenizer, monkeypatch, repetition_penalty):
    """Without a repetition penalty the op runs only while min_dec_len masks the end token (its logits need no
    copy otherwise); with one, at every step. Either way the tokens and log-probs are those of running it at
    every step."""
    model = AutoModelForCausalLM.from_pretrained(tiny_world["random_model"])
    model.eval()
    prompts, mask = left_pad([item["input_ids"] for item in eval_items(tiny_world, tokenizer, 4)],
                                         tokenizer.pad_token_id)
    sampling = SamplingConfig(max_dec_len=8, min_dec_len=3, temperature=1.3, repetition_penalty=repetition_penalty)
    counting = CountingPenalties(ops)
    with paddle.no_grad():
        skipping = infer_utils.decode_with_ops(counting, model, tokenizer, prompts, mask, sampling, 5, copies=2)
        monkeypatch.setattr(SamplingConfig, "penalizes", lambda self, step: True)
        every_step = infer_utils.decode_with_ops(ops, model, tokenizer, prompts, mask, sampling, 5, copies=2)
    steps = skipping[0].shape[1]
    assert steps > 3 and counting.penalty_calls == (3 if repetition_penalty == 1.0 else steps)
    np.testing.assert_array_equal(skipping[0].numpy(), every_step[0].numpy())
    np.testing.assert_array_equal(skipping[1].numpy(), every_step[1].numpy())


@pytest.mark.parametrize("greedy", [False, True])
def test_a_row_whose_logits_turn_nan_stops_the_rollout_naming_it(ops, tokenizer, tmp_path, greedy):
    # An untied tiny Llama whose embedding of a token only the second prompt holds is NaN: that prompt's rows
    # (2 and 3 of 3 prompts x 2 samples) get NaN logits. Before, the decode loop sampled from them all the same.
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    paddle.seed(0)
    LlamaForCausalLM(config).save_pretrained(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    prompts = ["1+2=", "7+8=", "3+4="]
    poisoned = set(tokenizer(prompts[1])["input_ids"]) - set(tokenizer(prompts[0] + prompts[2])["input_ids"])
    with paddle.no_grad():
        model.get_input_embeddings().weight[min(poisoned)] = float("nan")
    sampling = SamplingConfig(max_dec_len=4, greedy=greedy)
    with pytest.raises(FloatingPointError, match=r"decode step 0: nothing to sample from for row\(s\) \[2, 3\]"):
        generate_rollouts(model, tokenizer, prompt_items(tokenizer, prompts), 2, sampling, use_fast=True)


def test_fast_rollouts_respect_min_and_max_length(ops, tiny_world, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_world["random_model"])
    items = eval_items(tiny_world, tokenizer, 4)
    exp = generate_rollouts(model, tokenizer, items, 2, SamplingConfig(max_dec_len=9, min_dec_len=5))
    lengths = exp.response_mask.sum(axis=1).numpy()
    assert (lengths >= 5).all() and (lengths <= 9).all() and exp.response_mask.shape[1] <= 9
    finished = exp.finished.numpy()
    assert (lengths[~finished] == 9).all()


def test_an_other_paddlenlp_ops_falls_back_to_generate_with_one_warning(monkeypatch, tiny_world, tokenizer, caplog):
    monkeypatch.setitem(sys.modules, "paddlenlp_ops", types.ModuleType("paddlenlp_ops"))
    custom_ops.paddlenlp_ops_with.cache_clear()
    try:
        model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
        items = eval_items(tiny_world, tokenizer, 4)
        greedy = SamplingConfig(max_dec_len=4, greedy=True)
        with caplog.at_level(logging.WARNING, logger=custom_ops.logger.name):
            first = generate_rollouts(model, tokenizer, items, 1, greedy)
            generate_rollouts(model, tokenizer, items, 1, greedy)
        warnings = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
        assert len(warnings) == 1 and "rollout_sample" in warnings[0]
        reference = generate_rollouts(model, tokenizer, items, 1, greedy, use_fast=False)
        np.testing.assert_array_equal(first.input_ids.numpy(), reference.input_ids.numpy())
    finally:
        custom_ops.paddlenlp_ops_with.cache_clear()



def test_without_paddles_mkl_the_fast_loop_samples_on_paddles_forward_with_one_warning(
        ops, monkeypatch, tiny_world, tokenizer, caplog):
    """A Paddle built without MKL (WITH_MKL=OFF, as for ARM CPUs) has none for the native decoder's and the fused
    attention's products: those fall back to Paddle's ops, each said once, and the ops that need no products
    (the rollout ops, the fused elementwise ops) still run: the fast loop samples on Paddle's forward."""
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    items = eval_items(tiny_world, tokenizer, 4)
    greedy = SamplingConfig(max_dec_len=4, greedy=True)
    with_mkl = generate_rollouts(model, tokenizer, items, 1, greedy)
    monkeypatch.setattr(custom_ops, "paddle_library", lambda pattern: None)
    custom_ops.paddlenlp_ops_with.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=custom_ops.logger.name):
            assert infer_utils.rollout_ops() is ops and fused_ops() is ops
            assert attention_ops() is None and native_ops() is None
            without = generate_rollouts(model, tokenizer, items, 1, greedy)
            generate_rollouts(model, tokenizer, items, 1, greedy)
        warnings = sorted(r.getMessage() for r in caplog.records if "no MKL" in r.getMessage())
        assert len(warnings) == 2
        assert "['fused_attention']" in warnings[0] and "native_decoder_forward" in warnings[1]
        np.testing.assert_array_equal(without.input_ids.numpy(), with_mkl.input_ids.numpy())
    finally:
        custom_ops.paddlenlp_ops_with.cache_clear()


def test_weights_sliced_by_sharding_stage_3_decode_through_generate(ops, tiny_world):
    """Sharding stage 3 keeps each weight as a slice (`fw_storage`) and gathers it whole only within its layer's
    forward, so the fast loop, which reads the weights itself, leaves the rollout to generate()."""
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    assert infer_utils.fast_path_ops(model, use_fast=True) is not None
    model.qwen2.layers[0].mlp.up_proj.weight.fw_storage = paddle.zeros([1])  # as paddle's group_sharded stage 3 marks one
    assert "sharding stage 3" in infer_utils.unsupported_reason(model)
    assert infer_utils.fast_path_ops(model, use_fast=True) is None
