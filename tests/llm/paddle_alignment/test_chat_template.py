"""Chat templates compiled and rendered as transformers does (chat_template.py), the tool schemas of a run in its
prompts (data/datasets.py), and observation turns as the template writes them (agents/chat_turns.py).

TOOLS_TEMPLATE uses what the real templates use and paddlenlp's own Jinja environment lacks or does otherwise:
Qwen2.5's "# Tools" block (`tool | tojson`), Llama 3.1's indented schemas and date line (`tojson(indent=4)`,
`strftime_now`), `{% break %}`, `{% generation %}`, `raise_exception`, and JSON-encoded, trimmed observations.
The expected texts are written out by hand; with TRANSFORMERS_PYTHON set, transformers renders them too."""

import json
import subprocess
from datetime import datetime

import pytest

from helpers import transformers_python
from paddle_alignment.agents.chat_turns import observation_text
from paddle_alignment.chat_template import compile_chat_template, render_chat, template_source
from paddle_alignment.data import PromptOnlyDataset

TOOLS_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nindented: ' + tools[0].function.parameters | tojson(indent=4) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'forbidden' %}{{- raise_exception('no forbidden turns') }}{%- endif %}"
    "{%- if message.role == 'tool' %}{{- '<|im_start|>ipython\\n' + message.content | tojson + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}{%- endif %}"
    "{%- if loop.index == 9 %}{% break %}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' + strftime_now('%Y') + '\\n' }}{%- endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Compute <a> & 'b'.",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]


class Tokenizer:
    """What render_chat reads of a tokenizer."""

    special_tokens_map = {"bos_token": "<s>", "eos_token": "<|im_end|>"}
    eos_token = "<|im_end|>"
    chat_template = compile_chat_template(TOOLS_TEMPLATE)


def test_tool_schemas_render_as_transformers_renders_them():
    text = render_chat(Tokenizer(), [{"role": "user", "content": " 3+4? "}], TOOLS)
    schema = json.dumps(TOOLS[0], ensure_ascii=False)  # key order kept, nothing escaped as HTML
    indented = json.dumps(TOOLS[0]["function"]["parameters"], indent=4)
    assert text == (
        f"<s><|im_start|>system\n# Tools\n<tools>\n{schema}\n</tools>\nindented: {indented}<|im_end|>\n"
        f"<|im_start|>user\n3+4?<|im_end|>\n<|im_start|>assistant\n{datetime.now():%Y}\n"
    )
    assert '"description": "Compute <a> & \'b\'."' in text
    assert render_chat(Tokenizer(), [{"role": "user", "content": "hi"}]).startswith("<s><|im_start|>user\nhi")
    with pytest.raises(Exception, match="no forbidden turns"):
        render_chat(Tokenizer(), [{"role": "forbidden", "content": ""}])


def test_observations_read_as_the_template_writes_them():
    # Tool answers JSON-encoded, user turns trimmed, as Llama 3.1's template writes them.
    assert observation_text(Tokenizer(), ['4 "x"\n'], "tool") == '\n<|im_start|>ipython\n"4 \\"x\\"\\n"<|im_end|>\n<|im_start|>assistant\n' + f"{datetime.now():%Y}\n"
    assert observation_text(Tokenizer(), ["  4  "], "user").startswith("\n<|im_start|>user\n4<|im_end|>\n")


def test_a_list_of_named_templates_gives_the_default_and_refuses_a_tool_use_one():
    assert template_source({"chat_template": [{"name": "default", "template": "A"}, {"name": "rag", "template": "B"}]}) == "A"
    assert template_source({"chat_template": "C"}) == "C" and template_source({}) is None
    with pytest.raises(ValueError, match="names a 'tool_use' template"):
        template_source({"chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]})


def test_a_run_with_tools_shows_their_schemas_in_its_prompts(tmp_path, tiny_world):
    from paddle_alignment.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_world["random_model"])
    tokenizer.chat_template = Tokenizer.chat_template
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"dialogue": ["3+4?", "7"], "tgt": "7"}) + "\n")
    with_tools, without = (PromptOnlyDataset(str(rows), tokenizer, 4096, tools=tools)[0]["prompt"] for tools in (TOOLS, None))
    assert "# Tools" in with_tools and json.dumps(TOOLS[0], ensure_ascii=False) in with_tools and "# Tools" not in without


@pytest.mark.skipif(transformers_python() is None, reason="transformers is not installed (set TRANSFORMERS_PYTHON)")
def test_transformers_renders_the_same_text():
    script = (
        "import sys, json\n"
        "from tokenizers import Tokenizer, models\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "template, tools, messages = json.loads(sys.argv[1])\n"
        "t = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({'a': 0}, unk_token='a')), bos_token='<s>', eos_token='<|im_end|>')\n"
        "t.chat_template = template\n"
        "print(json.dumps(t.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)))\n"
    )
    messages = [{"role": "user", "content": " 3+4? "}, {"role": "assistant", "content": "x"}, {"role": "tool", "content": '4 "x"\n'}]
    for tools in (TOOLS, None):
        result = subprocess.run([transformers_python(), "-c", script, json.dumps([TOOLS_TEMPLATE, tools, messages])],
                                check=True, capture_output=True, text=True)
        assert json.loads(result.stdout) == render_chat(Tokenizer(), messages, tools)


def test_a_tokenizer_config_template_paddlenlp_cannot_compile_loads_renders_and_is_saved(tiny_world, tmp_path):
    """paddlenlp's own loader refuses `{% generation %}` and `{% break %}` in tokenizer_config.json."""
    import shutil

    from paddle_alignment.models.loading import load_tokenizer

    folder, saved = tmp_path / "tokenizer", tmp_path / "saved"
    shutil.copytree(tiny_world["random_model"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOLS_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": " 3+4? "}]
    expected = render_chat(Tokenizer(), messages, TOOLS).replace("<s>", "")  # the tiny tokenizer has no BOS token
    assert render_chat(load_tokenizer(str(folder)), messages, TOOLS) == expected
    load_tokenizer(str(folder)).save_pretrained(str(saved))
    assert render_chat(load_tokenizer(str(saved)), messages, TOOLS) == expected
