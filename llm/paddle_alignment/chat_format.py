"""The Qwen chat format, shared by the data generators and the tokenizer's chat template."""

import json

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"

# Jinja chat template of the tiny tokenizer: Qwen2.5's layout. Tool answers are Qwen2.5's too: consecutive
# `tool` messages share one user turn, each inside <tool_response> tags. Tool calls are the assistant's text.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render_chat(messages, add_generation_prompt=True):
    """`messages` ({"role", "content"}) rendered exactly as CHAT_TEMPLATE renders them."""
    text = ""
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if role != "tool":
            text += f"{IM_START}{role}\n{content}{IM_END}\n"
            continue
        if i == 0 or messages[i - 1]["role"] != "tool":
            text += f"{IM_START}user"
        text += f"\n<tool_response>\n{content}\n</tool_response>"
        if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
            text += f"{IM_END}\n"
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def chat_prompt(user, system=None, assistant_prefix=""):
    """Render a one-turn conversation up to the assistant's turn, exactly as CHAT_TEMPLATE does."""
    turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return render_chat(turns) + assistant_prefix


def tool_call_text(name, arguments):
    """An assistant's call of tool `name` with `arguments` (a dict) in Qwen2.5's form."""
    return f"{TOOL_CALL_START}\n{json.dumps({'name': name, 'arguments': arguments})}\n{TOOL_CALL_END}"
