import json
import os

import numpy as np
import paddle
import pytest
from tokenizers import Tokenizer

from llm.tools.build_real_model import ARCHITECTURES, MODELS, real_config
from llm.tools.build_real_tokenizer import build_real_tokenizer
from paddle_alignment.models.loading import load_tokenizer, pretrained_tokenizer

CHAT = "<|im_start|>user\nWhat is 3×4? café ½<|im_end|>\n<|im_start|>assistant\n<tool_call>{}</tool_call>"


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen_tokenizer"))
    build_real_tokenizer(folder, "qwen2", 151936)
    return folder


def test_the_qwen_tokenizer_covers_the_vocabulary_with_the_real_special_ids(qwen_tokenizer):
    tokenizer = load_tokenizer(qwen_tokenizer)
    assert len(tokenizer) == 151936
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<|file_sep|>")] == [
        151643, 151644, 151645, 151657, 151664
    ]
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    # Every id decodes, placeholders included: a random model's samples are text.
    assert tokenizer.decode([300, 151000, 151935, 65]) == "<ph300><ph151000><ph151935>A"


def test_the_tokenizer_files_give_the_ids_transformers_gets(qwen_tokenizer):
    # tokenizer.json read by the `tokenizers` library, as transformers and vLLM read it.
    tokenizer = load_tokenizer(qwen_tokenizer)
    ids = tokenizer(CHAT, add_special_tokens=False)["input_ids"]
    assert ids == Tokenizer.from_file(os.path.join(qwen_tokenizer, "tokenizer.json")).encode(CHAT, add_special_tokens=False).ids
    assert ids[:2] == [151644, ord("u")] and ids[-1] == 151658  # bytes between whole special tokens
    assert tokenizer.decode(ids) == CHAT  # the newline after <|im_end|> is kept
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    config = json.load(open(os.path.join(qwen_tokenizer, "tokenizer_config.json")))
    assert config["tokenizer_class"] == "Qwen2Tokenizer" and config["added_tokens_decoder"]["151657"]["special"] is False


def test_the_llama_tokenizer_loads_from_transformers_generic_class(tmp_path):
    build_real_tokenizer(str(tmp_path), "llama", 128256)
    assert json.load(open(tmp_path / "tokenizer_config.json"))["tokenizer_class"] == "PreTrainedTokenizerFast"
    tokenizer = load_tokenizer(str(tmp_path))
    assert len(tokenizer) == 128256
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (128000, 128009)
    assert tokenizer.pad_token == tokenizer.eos_token  # Llama 3 ships no pad token
    text = tokenizer.apply_chat_template([{"role": "user", "content": " hi "}], tokenize=False, add_generation_prompt=True)
    assert text == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    assert tokenizer(text, add_special_tokens=False)["input_ids"][:3] == [128000, 128006, ord("u")]


def test_a_vocabulary_too_small_for_the_special_tokens_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vocab_size 1000 is too small for the qwen2 special tokens"):
        build_real_tokenizer(str(tmp_path), "qwen2", 1000)


@pytest.mark.parametrize("name, parameters", [("qwen2.5-0.5b", 494_032_768), ("llama-3.2-1b", 1_235_814_400)])
def test_the_architectures_have_the_real_models_sizes(name, parameters):
    family, config = real_config(name)
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    kv = hidden // config.num_attention_heads * config.num_key_value_heads
    attention = hidden * hidden * 2 + hidden * kv * 2 + (hidden + 2 * kv if family == "qwen2" else 0)  # Qwen's q/k/v biases
    per_layer = attention + 3 * hidden * config.intermediate_size + 2 * hidden
    assert vocab * hidden * (1 if config.tie_word_embeddings else 2) + layers * per_layer + hidden == parameters


def test_qwen3_0_6b_has_the_real_models_size_and_tokens(tmp_path):
    family, config = real_config("qwen3-0.6b")
    with paddle.LazyGuard():
        model = MODELS[family][1](config)
    assert sum(int(np.prod(p.shape)) for p in model.parameters()) == 596_049_920  # Qwen3-0.6B's model card: 0.6B
    build_real_tokenizer(str(tmp_path), family, config.vocab_size)
    tokenizer = pretrained_tokenizer(str(tmp_path))
    assert tokenizer.convert_tokens_to_ids(["<tool_response>", "<think>", "</think>"]) == [151665, 151667, 151668]


def test_num_layers_cuts_the_architecture_and_is_checked():
    _, config = real_config("qwen2.5-0.5b", num_layers=2)
    assert (config.num_hidden_layers, config.max_window_layers, config.vocab_size) == (2, 2, 151936)
    with pytest.raises(ValueError, match="num_layers must be in 1..24"):
        real_config("qwen2.5-0.5b", num_layers=30)
    with pytest.raises(ValueError, match="unknown architecture 'qwen3'"):
        real_config("qwen3")
    assert set(ARCHITECTURES) >= {"qwen2.5-0.5b", "qwen2.5-7b", "llama-3.2-1b", "llama-3.1-8b"}
