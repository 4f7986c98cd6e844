"""Micro-batches by a token budget (micro_batches.py): how rows are grouped, how little padding is left, and
that log-probs, losses and gradients equal those of the padded batch."""

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

from paddle_alignment.algos.losses import LossScale
from paddle_alignment.experience import Experience
from paddle_alignment.micro_batches import MicroBatching, padded_tokens, token_budget_batches
from paddle_alignment.models.ppo_model_utils import PolicyObjective, response_token_stats

VOCAB = 61


def test_rows_are_grouped_by_length_within_the_budget():
    rng = np.random.default_rng(0)
    prompt, response = rng.integers(5, 30, 40), rng.integers(1, 200, 40)
    batches = token_budget_batches(prompt, response, range(40), budget=600)
    assert sorted(row for rows in batches for row in rows) == list(range(40))
    for rows in batches:
        assert len(rows) == 1 or padded_tokens(prompt, response, np.array(rows)) <= 600
    ends = [max(response[rows]) for rows in batches]
    assert ends == sorted(ends)  # consecutive in length
    # A row over the budget goes alone; a count splits the largest micro-batches until there are that many.
    assert token_budget_batches(np.array([10, 10]), np.array([500, 2]), [0, 1], budget=100) == [[1], [0]]
    split = token_budget_batches(prompt, response, range(40), budget=600, count=len(batches) + 3)
    assert len(split) == len(batches) + 3 and sorted(r for rows in split for r in rows) == list(range(40))
    with pytest.raises(ValueError, match="3 rows cannot form 4 micro-batches"):
        token_budget_batches(prompt, response, range(3), budget=600, count=4)


def test_lengths_spanning_ten_times_leave_little_padding():
    """64 responses of 50 to 500 tokens after prompts of 30 to 60, micro-batches of 8 rows' worth of tokens:
    the padded split computes on 1.6 x the real tokens, the token budget on at most 1.15 x."""
    rng = np.random.default_rng(1)
    prompt, response = rng.integers(30, 61, 64), rng.integers(50, 501, 64)
    real = int(prompt.sum() + response.sum())
    fixed = 64 * int(prompt.max() + response.max())
    budget = 8 * int(prompt.max() + response.max())
    dynamic = sum(padded_tokens(prompt, response, np.array(rows)) for rows in token_budget_batches(prompt, response, range(64), budget))
    assert fixed / real > 1.6
    assert dynamic / real <= 1.15, dynamic / real


def tiny_model():
    paddle.seed(0)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, dtype="float32",
    ))


def uneven_experience():
    """6 rows: left-padded prompts of 3 to 9 tokens, responses of 2 to 20 tokens (right-padded)."""
    rng = np.random.default_rng(2)
    prompts, responses = [3, 9, 5, 4, 8, 6], [20, 2, 11, 3, 7, 16]
    width, length = max(prompts), max(responses)
    ids = rng.integers(1, VOCAB, (6, width + length))
    mask = np.zeros((6, width + length), "int64")
    response_mask = np.zeros((6, length), "float32")
    for row, (p, r) in enumerate(zip(prompts, responses)):
        mask[row, width - p : width + r] = 1
        response_mask[row, :r] = 1
    ids = np.where(mask > 0, ids, 0)
    exp = Experience(paddle.to_tensor(ids), paddle.to_tensor(mask), paddle.to_tensor(response_mask),
                     paddle.arange(6) // 2, paddle.ones([6], "bool"), [""] * 6, [""] * 6, [""] * 6)
    exp.old_logprobs = paddle.to_tensor(rng.normal(-2, 0.3, (6, length)).astype("float32")) * exp.response_mask
    exp.ref_logprobs = paddle.to_tensor(rng.normal(-2, 0.3, (6, length)).astype("float32")) * exp.response_mask
    exp.advantages = paddle.to_tensor(rng.normal(0, 1, (6, length)).astype("float32")) * exp.response_mask
    return exp


def test_trimming_cuts_only_unused_padding():
    exp = uneven_experience()
    micro = exp.take([1, 3]).trimmed()  # prompts of 9 and 4, responses of 2 and 3
    assert micro.input_ids.shape == [2, 9 + 3] and micro.prompt_len == 9
    assert all(getattr(micro, name).shape == [2, 3] for name in ("response_mask", "old_logprobs", "advantages"))
    prompt, response = micro.real_lengths()
    assert prompt.tolist() == [9, 4] and response.tolist() == [2, 3]


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_token_budget_micro_batches_give_the_padded_batchs_logprobs_loss_and_gradients(aggregation):
    model, exp = tiny_model(), uneven_experience()
    objective = PolicyObjective("ppo_clip", "k3", aggregation, kl_loss_coeff=0.1, entropy_coeff=0.01,
                                clip_range_ratio_low=0.2, clip_range_ratio_high=0.28, temperature=0.8)
    scale = LossScale(float(exp.response_mask.sum()), float(len(exp)))

    def loss_and_grads(batching):
        model.clear_gradients()
        total = 0.0
        for rows in batching.split(exp, range(len(exp))):
            micro = batching.micro_batch(exp, rows)
            logprobs, entropy = response_token_stats(model, micro, 0.8, chunk_tokens=7)
            loss, _ = objective.loss(logprobs, entropy, micro.old_logprobs, micro.ref_logprobs, micro.advantages,
                                     micro.response_mask, scale)
            loss.backward()
            total += float(loss)
        return total, {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}

    padded = MicroBatching(rows_per_batch=6, dynamic=False)
    by_tokens = MicroBatching(rows_per_batch=2, dynamic=True, max_tokens=40)
    assert len(by_tokens.split(exp, range(6))) >= 3
    padded_loss, padded_grads = loss_and_grads(padded)
    loss, grads = loss_and_grads(by_tokens)
    assert loss == pytest.approx(padded_loss, rel=1e-5, abs=1e-7)
    for name, grad in padded_grads.items():
        np.testing.assert_allclose(grads[name], grad, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(grad).max()), err_msg=name)

    def logprobs_of(micro):
        with paddle.no_grad():
            return response_token_stats(model, micro, 0.8)[0]

    whole = padded.run(exp, logprobs_of) * exp.response_mask
    np.testing.assert_allclose((by_tokens.run(exp, logprobs_of) * exp.response_mask).numpy(), whole.numpy(), rtol=1e-5, atol=1e-5)
