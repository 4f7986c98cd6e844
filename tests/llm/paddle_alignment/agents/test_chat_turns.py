"""Token-in-token-out across turns (agents/chat_turns.py): the ids appended after a sampled assistant turn are
those the chat template puts there, separators included, for the tiny tokenizer, Qwen2.5's vocabulary and a
template with one turn per tool answer (the tiny and real tokenizers' template groups consecutive answers into
one user turn, as Qwen2.5's does)."""

from contextlib import contextmanager

import pytest

from llm.tools.build_real_tokenizer import build_real_tokenizer
from llm.tools.build_tokenizer import build_tokenizer
from paddle_alignment.agents.chat_turns import TemplateError, observation_ids
from paddle_alignment.chat_template import compile_chat_template
from paddle_alignment.models.loading import load_tokenizer

# One turn of role `tool` per answer (the layout of many templates other than Qwen2.5's).
TOOL_ROLE_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module", params=["tiny", "qwen2.5"])
def tokenizer(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(request.param))
    if request.param == "tiny":
        build_tokenizer(folder)
    else:
        build_real_tokenizer(folder, "qwen2", 151936)
    return load_tokenizer(folder)


def full_render_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)["input_ids"]


def test_prompt_plus_sampled_turn_plus_observation_ids_equal_the_rendered_conversation(tokenizer):
    """Where decode and encode agree (short digit strings), the incremental ids equal a full render's."""
    question = [{"role": "user", "content": "3+4="}]
    prompt = full_render_ids(tokenizer, question)
    sampled = tokenizer.encode("7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    trajectory = prompt + sampled + observation_ids(tokenizer, ["12"])
    messages = question + [{"role": "assistant", "content": "7"}, {"role": "tool", "content": "12"}]
    assert trajectory == full_render_ids(tokenizer, messages)


def test_the_separator_after_the_end_of_turn_token_is_part_of_the_observation(tokenizer):
    ids = observation_ids(tokenizer, ["12"])
    text = tokenizer.decode(ids)
    assert text == "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@contextmanager
def chat_template(tokenizer, template):
    original = tokenizer.chat_template
    tokenizer.chat_template = compile_chat_template(template)
    try:
        yield
    finally:
        tokenizer.chat_template = original


def test_consecutive_tool_answers_are_joined_as_the_template_groups_them(tokenizer):
    question = [{"role": "user", "content": "3+4="}]
    prompt = full_render_ids(tokenizer, question)
    sampled = tokenizer.encode("7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    messages = question + [{"role": "assistant", "content": "7"}, {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    assert prompt + sampled + observation_ids(tokenizer, ["1", "2"]) == full_render_ids(tokenizer, messages)
    assert tokenizer.decode(observation_ids(tokenizer, ["1", "2"])) == (
        "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_template_with_one_turn_per_tool_answer_gets_one_turn_per_answer(tokenizer):
    with chat_template(tokenizer, TOOL_ROLE_TEMPLATE):
        assert tokenizer.decode(observation_ids(tokenizer, ["1", "2"])) == (
            "\n<|im_start|>tool\n1<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n"
        )


def test_a_template_that_rewrites_the_history_is_refused(tokenizer):
    # Renders the last message only: an observation replaces the conversation instead of following it.
    with chat_template(tokenizer, "{{ '<|im_start|>' + messages[-1]['role'] + '\\n' + messages[-1]['content'] + '<|im_end|>\\n' }}"):
        with pytest.raises(TemplateError, match="does not render a 'tool' turn after an assistant turn's end"):
            observation_ids(tokenizer, ["1"])


def test_an_eos_token_that_ends_no_assistant_turn_is_refused(tokenizer):
    original = tokenizer.eos_token
    tokenizer.eos_token = "<|endoftext|>"  # a base tokenizer's EOS; the template ends turns with <|im_end|>
    try:
        with pytest.raises(TemplateError, match="ends no assistant turn with the EOS token '<\\|endoftext\\|>'"):
            observation_ids(tokenizer, [])
    finally:
        tokenizer.eos_token = original
