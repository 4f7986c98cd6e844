"""The Qwen chat format, shared by the data generators and the tokenizer's chat template."""

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# Jinja chat template of the tiny tokenizer: the same layout as Qwen2.5's, without tool calls.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_prompt(user, system=None, assistant_prefix=""):
    """Render a one-turn conversation up to the assistant's turn, exactly as CHAT_TEMPLATE does."""
    turns = ([("system", system)] if system else []) + [("user", user)]
    text = "".join(f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in turns)
    return f"{text}{IM_START}assistant\n{assistant_prefix}"
