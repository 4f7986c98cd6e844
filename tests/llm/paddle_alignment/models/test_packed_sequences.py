"""The packed forward of preference training (a prompt and its replies in one row, the prompt once, each reply
attending to the prompt and itself) against each prompt + reply run alone: per-sequence log-probs and the
gradients of the weights, for paddlenlp's Qwen2 (tied and untied head) and Llama, a LoRA-wrapped model, at the
tiny vocabulary and chunked at Qwen2.5's 151,936 entries; and with several groups packed into one row."""

import numpy as np
import paddle
import pytest
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from paddle_alignment.algos.token_stats import gather_logprobs
from paddle_alignment.models.packed_sequences import pack_groups, packed_sequence_stats, rows_of_groups

VOCAB = 67


def tiny_model(model_class=Qwen2ForCausalLM, config_class=Qwen2Config, tie_word_embeddings=False, vocab=VOCAB):
    paddle.seed(0)
    return model_class(config_class(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie_word_embeddings, dtype="float32",
    ))


def groups(count=3, replies=2, vocab=VOCAB, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(1, vocab, rng.integers(1, 7)).tolist(), [rng.integers(1, vocab, rng.integers(1, 6)).tolist() for _ in range(replies)])
        for _ in range(count)
    ]


def alone_logps(model, prompt, reply):
    """log p(reply | prompt), summed, from a forward of prompt + reply alone."""
    ids = paddle.to_tensor([prompt + reply], dtype="int64")
    logits = model(input_ids=ids, return_dict=True).logits
    logps = gather_logprobs(logits[:, len(prompt) - 1 : -1].astype("float32"), ids[:, len(prompt):])
    return logps.sum()


def gradients(model, loss):
    model.clear_gradients()
    loss.backward()
    return {name: p.grad.numpy().copy() for name, p in model.named_parameters() if p.grad is not None}


def weighted(values):
    return (values * paddle.arange(1, values.shape[0] + 1, dtype=values.dtype)).sum()


def compare_with_alone(model, data, **pack_options):
    batch = pack_groups(data, pad_token_id=0, **pack_options)
    stats = packed_sequence_stats(model, batch, chunk_tokens=4)
    count = len(data)
    alone = paddle.stack([alone_logps(model, data[s % count][0], data[s % count][1][s // count]) for s in range(2 * count)])
    np.testing.assert_allclose(stats.logp_sums.numpy(), alone.numpy(), rtol=1e-5, atol=1e-5)
    lengths = [len(data[s % count][1][s // count]) for s in range(2 * count)]
    np.testing.assert_array_equal(stats.lengths.numpy(), lengths)
    packed_grads = gradients(model, weighted(stats.logp_sums))
    alone_grads = gradients(model, weighted(paddle.stack(
        [alone_logps(model, data[s % count][0], data[s % count][1][s // count]) for s in range(2 * count)])))
    assert packed_grads.keys() == alone_grads.keys() and packed_grads
    for name in packed_grads:
        np.testing.assert_allclose(packed_grads[name], alone_grads[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("tie", [False, True])
def test_packed_log_probs_and_gradients_equal_each_reply_run_alone_for_qwen2(tie):
    compare_with_alone(tiny_model(tie_word_embeddings=tie), groups())


def test_packed_log_probs_and_gradients_equal_each_reply_run_alone_for_llama():
    compare_with_alone(tiny_model(LlamaForCausalLM, LlamaConfig), groups())


def test_several_groups_packed_into_one_row_equal_each_reply_run_alone():
    data = groups(count=4)
    batch = pack_groups(data, pad_token_id=0, row_tokens=64)
    assert batch.input_ids.shape[0] < 4
    compare_with_alone(tiny_model(), data, row_tokens=64)


def test_packed_forward_of_a_lora_model_equals_each_reply_run_alone():
    model = LoRAModel(tiny_model(), LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8, dtype="float32"))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.set_value(paddle.randn(parameter.shape) * 0.1)
    compare_with_alone(model, groups())


def test_packed_forward_at_the_real_vocabulary_equals_each_reply_run_alone():
    vocab = 151936
    compare_with_alone(tiny_model(vocab=vocab), groups(count=2, vocab=vocab))


def test_a_rejected_reply_does_not_see_the_chosen_one():
    batch = pack_groups([([5, 6, 7], [[8, 9], [10, 11, 12]])], pad_token_id=0)
    np.testing.assert_array_equal(batch.input_ids.numpy(), [[5, 6, 7, 8, 7, 10, 11]])
    np.testing.assert_array_equal(batch.position_ids.numpy(), [[0, 1, 2, 3, 2, 3, 4]])
    mask = batch.attention_mask.numpy()[0]
    assert not mask[4, 2:4].any() and mask[4, :2].all() and mask[4, 4]
    np.testing.assert_array_equal(batch.label_positions.numpy(), [2, 3, 4, 5, 6])
    np.testing.assert_array_equal(batch.labels.numpy(), [8, 9, 10, 11, 12])
    np.testing.assert_array_equal(batch.sequence_ids.numpy(), [0, 0, 1, 1, 1])


def test_groups_are_packed_first_fit_by_decreasing_length():
    assert rows_of_groups([5, 3, 4, 2], 8) == [[0, 1], [2, 3]]
    assert rows_of_groups([9, 3], 8) == [[0], [1]]
    assert rows_of_groups([5, 3], 0) == [[0], [1]]


def test_packed_forward_through_the_fused_cpu_kernels_equals_each_reply_run_alone():
    from paddle_alignment.models.fused_kernels import use_fused_kernels

    model = tiny_model()
    if use_fused_kernels(model) == 0:
        pytest.skip("paddlenlp_ops is not built with the fused CPU kernels")
    compare_with_alone(model, groups())
