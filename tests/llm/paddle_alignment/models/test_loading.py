import json
import os
import shutil
from types import SimpleNamespace

import pytest

from llm.tools.build_real_tokenizer import build_real_tokenizer
from paddle_alignment.models.loading import load_dtype, load_tokenizer


@pytest.mark.parametrize(
    "bf16, fp16, level, dtype",
    [
        (False, False, "O1", "float32"),  # the CPU configs
        (True, False, "O1", "float32"),  # the GPU configs: float32 weights under bfloat16 autocast
        (True, False, "O2", "bfloat16"),
        (False, True, "O1", "float32"),
        (False, True, "O2", "float16"),
    ],
)
def test_weights_load_in_float32_unless_o2_asks_for_half_precision(bf16, fp16, level, dtype):
    # Never the checkpoint's dtype: a downloaded Qwen2.5's config.json says bfloat16.
    assert load_dtype(SimpleNamespace(bf16=bf16, fp16=fp16, fp16_opt_level=level)) == dtype


HARD_STRINGS = ["hi  there\n 12345 ünï", "  leading spaces, 3.14159 and 1,000,000", "日本語のテキスト 🙂", "a\t\tb\r\nc",
                "<|im_end|><|eot_id|><|begin_of_text|> after specials", "x<tool_call>{\"a\": 1}</tool_call>"]


def as_transformers5_writes_it(folder, target):
    """`folder` (a tokenizer as transformers 4 wrote it) saved as transformers 5 saves it: tokenizer.json alone, the
    chat template in chat_template.jinja, a generic class named TokenizersBackend unless transformers 5 has the
    family's own class (Qwen2Tokenizer)."""
    os.makedirs(target)
    shutil.copy(os.path.join(folder, "tokenizer.json"), target)
    config = json.load(open(os.path.join(folder, "tokenizer_config.json")))
    with open(os.path.join(target, "chat_template.jinja"), "w") as f:
        f.write(config.pop("chat_template"))
    if config["tokenizer_class"] != "Qwen2Tokenizer":
        config["tokenizer_class"] = "TokenizersBackend"
    json.dump(config, open(os.path.join(target, "tokenizer_config.json"), "w"))
    return target


@pytest.mark.parametrize("family, vocabulary", [("qwen2", 151936), ("llama", 128256)])
def test_a_tokenizer_folder_written_by_transformers_5_encodes_and_renders_chats_as_its_transformers_4_twin(tmp_path, family, vocabulary):
    v4 = str(tmp_path / "v4")
    build_real_tokenizer(v4, family, vocabulary)
    v5 = as_transformers5_writes_it(v4, str(tmp_path / "v5"))
    old, new = load_tokenizer(v4), load_tokenizer(v5)
    for text in HARD_STRINGS:
        assert new(text, add_special_tokens=False)["input_ids"] == old(text, add_special_tokens=False)["input_ids"]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": HARD_STRINGS[0]}]
    rendered = new.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == old.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (new.eos_token, new.pad_token) == (old.eos_token, old.pad_token)


def test_a_paddle_folder_without_every_weight_stops_at_load_naming_them(tiny_world, tmp_path):
    """paddlenlp's loader would initialise what the folder lacks at random and only warn."""
    from paddle_alignment.models.loading import load_score_model, pretrained_causal_lm

    folder = tmp_path / "model"
    shutil.copytree(tiny_world["random_model"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"has no tensor for \['qwen2.layers.2."):
        pretrained_causal_lm(str(folder))
    # A causal LM's folder gives a score model its backbone; only the head and normalizer start fresh.
    score = load_score_model(tiny_world["random_model"], SimpleNamespace(fp16_opt_level="O1", bf16=False, fp16=False, tensor_parallel_degree=1, pipeline_parallel_degree=1, device="cpu"), score_type="reward")
    assert type(score).__name__ == "Qwen2ForScore"
