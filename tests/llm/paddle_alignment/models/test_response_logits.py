"""The trainer's `response_logits`, whose LM head projects only the response positions (a pre-hook on the
head), against the full logits sliced afterwards: values and gradients, for paddlenlp's Qwen2 (tied and untied
head) and Llama, a LoRA-wrapped actor, and a model without a separate head."""

from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from llm.alignment.ppo.ppo_trainer import response_logits
from paddle_alignment.algos.token_stats import position_ids_from_mask
from paddle_alignment.models.ppo_model_utils import lm_head_layer

PROMPT_LEN, RESPONSE_LEN, VOCAB = 5, 4, 67


def tiny_causal_lm(model_class, config_class, tie_word_embeddings):
    paddle.seed(0)
    return model_class(config_class(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie_word_embeddings, dtype="float32",
    ))


def with_lora(model):
    config = LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8, dtype="float32")
    lora = LoRAModel(model, config)
    for name, parameter in lora.named_parameters():
        if "lora_B" in name:  # away from zero, so the adapters change the logits
            parameter.set_value(paddle.randn(parameter.shape) * 0.1)
    return lora


class NoSeparateHead(paddle.nn.Layer):
    """A causal LM whose logits come out of its forward with no `lm_head` sublayer."""

    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, VOCAB)

    def forward(self, input_ids, attention_mask, position_ids, return_dict):
        return SimpleNamespace(logits=self.embed(input_ids))


def experience(rows=3):
    rng = np.random.default_rng(0)
    mask = np.ones((rows, PROMPT_LEN + RESPONSE_LEN), "int64")
    mask[1, :2] = 0  # left-padded prompt
    mask[2, -1] = 0  # response ended early
    return SimpleNamespace(
        input_ids=paddle.to_tensor(rng.integers(0, VOCAB, size=mask.shape)), attention_mask=paddle.to_tensor(mask),
        prompt_len=PROMPT_LEN,
    )


def full_logits_sliced(model, exp):
    """response_logits as it was: every position through the head, then the response ones."""
    logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                   position_ids=position_ids_from_mask(exp.attention_mask), return_dict=True).logits
    return logits[:, exp.prompt_len - 1 : -1]


def logits_and_grads(function, model, exp, weights):
    model.clear_gradients()
    logits = function(model, exp)
    (logits * weights).sum().backward()
    return logits.numpy(), {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}


MODELS = {
    "qwen2-tied": lambda: tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, True),
    "qwen2": lambda: tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, False),
    "llama": lambda: tiny_causal_lm(LlamaForCausalLM, LlamaConfig, False),
    "lora-qwen2": lambda: with_lora(tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, False)),
    "no-separate-head": NoSeparateHead,
}


@pytest.mark.parametrize("name", MODELS)
def test_response_logits_match_the_full_logits_sliced(name):
    model = MODELS[name]()
    assert (lm_head_layer(model) is None) == (name == "no-separate-head")
    exp = experience()
    weights = paddle.randn([3, RESPONSE_LEN, VOCAB])
    logits, grads = logits_and_grads(response_logits, model, exp, weights)
    expected_logits, expected_grads = logits_and_grads(full_logits_sliced, model, exp, weights)
    assert logits.shape == (3, RESPONSE_LEN, VOCAB)
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for key, grad in grads.items():
        np.testing.assert_allclose(grad, expected_grads[key], rtol=1e-5, atol=1e-5 * max(1.0, np.abs(grad).max()), err_msg=key)
    # The hook is gone afterwards: a plain call gives every position's logits.
    plain = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                  position_ids=position_ids_from_mask(exp.attention_mask), return_dict=True).logits
    assert plain.shape[1] == PROMPT_LEN + RESPONSE_LEN
