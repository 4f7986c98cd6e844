"""A tokenizer's chat template, compiled and rendered as transformers does, tool schemas included.

A model's chat template is the text format it was trained on, and prompts must match it character for character.
paddlenlp compiles templates in a Jinja environment of its own: without transformers' `tojson` (Jinja's built-in
sorts the keys and escapes `<`, `>`, `&` and `'` as HTML, so a tool schema in Qwen2.5's "# Tools" block reads
differently), `strftime_now` (Llama 3.1's date line), `{% break %}`/`{% continue %}` and `{% generation %}`
(templates written for assistant-only SFT losses), and keeping a newline that transformers trims from the end.
Its `apply_chat_template` passes no `tools=` either. Here the template is compiled in transformers' environment
(`compile_chat_template`) and `render_chat` passes what transformers passes: the messages, the tool schemas, the
generation prompt flag and the special tokens.
"""

import json
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlocks(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body (transformers uses the block to find the
    assistant's characters for an SFT loss mask; rendering the text is all a prompt needs)."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(format):
    return datetime.now().strftime(format)


def compile_chat_template(source):
    """The Jinja template `source` (a chat template's text) compiled in transformers' environment."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlocks])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return environment.from_string(source)


def template_source(tokenizer_config):
    """The chat template text of a tokenizer_config.json's `chat_template` (None when it has none): a string, or
    from transformers 4's list of named templates the one named `default`. A list that also names a `tool_use`
    template is refused: transformers renders conversations with tools in it, and which one a run needs is not
    known when the tokenizer loads."""
    template = tokenizer_config.get("chat_template")
    if not isinstance(template, list):
        return template
    named = {entry["name"]: entry["template"] for entry in template}
    if "tool_use" in named:
        raise ValueError("tokenizer_config.json: chat_template names a 'tool_use' template beside 'default'; write the "
                         "one the run needs to chat_template.jinja in the model folder")
    return named.get("default")


def render_chat(tokenizer, messages, tools=None, add_generation_prompt=True):
    """`messages` ({"role", "content", ...}) in the tokenizer's chat template, with the function schemas `tools`
    (each {"type": "function", "function": {...}}) where the template shows them: what transformers'
    `apply_chat_template(messages, tools=tools, tokenize=False)` returns."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template")
    return tokenizer.chat_template.render(
        messages=list(messages), tools=list(tools) if tools else None, documents=None,
        add_generation_prompt=add_generation_prompt, **tokenizer.special_tokens_map,
    )
