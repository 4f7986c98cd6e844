"""Token-in-token-out across turns: the ids appended after a sampled assistant turn, never a re-rendered history.

Decoding a trajectory, re-applying the chat template and encoding again does not give back the ids that were
sampled (BPE is not a bijection; templates trim, add system prompts, drop separators: verl #6501, TRL #5224,
slime #2263), and the importance ratios then describe tokens nobody sampled. So a multi-turn trajectory is
the sampled ids as sampled, and between turns only the ids of the new turn: what the chat template renders
after an assistant turn's end-of-turn token (its separator included) for the observation turns and the
opening of the next assistant turn. They are found once per shape of turn by rendering a fixed conversation
with and without the new turns and encoding the difference; special tokens split the text, so encoding the
difference alone gives the ids it gets inside the whole conversation.
"""

from functools import lru_cache

PROBE_CONVERSATION = ({"role": "user", "content": "?"}, {"role": "assistant", "content": "!"})


class TemplateError(ValueError):
    """The chat template does not render a conversation by appending its turns."""


def render(tokenizer, messages, add_generation_prompt):
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


@lru_cache(maxsize=None)
def turn_texts(tokenizer, template, eos_token, role):
    """(before, between, after): the template's text from the end of an assistant turn's end-of-turn token to
    the content of an observation turn of `role`, between the contents of two consecutive ones, and from the
    last one's content to the open next assistant turn. `template` and `eos_token` (the tokenizer's) key the
    cache."""
    first, second = "\x00first\x00", "\x00second\x00"  # found nowhere else in a rendered conversation
    closed = render(tokenizer, PROBE_CONVERSATION, add_generation_prompt=False)
    end = closed.rfind(eos_token)
    if end < 0:
        raise TemplateError(f"the chat template ends no assistant turn with the EOS token {eos_token!r}")
    prefix = closed[: end + len(eos_token)]
    observations = [{"role": role, "content": first}, {"role": role, "content": second}]
    extended = render(tokenizer, [*PROBE_CONVERSATION, *observations], add_generation_prompt=True)
    if not extended.startswith(prefix) or extended.count(first) != 1 or extended.count(second) != 1:
        raise TemplateError(f"the chat template does not render a {role!r} turn by appending it to the conversation")
    before, _, rest = extended[len(prefix):].partition(first)
    between, _, after = rest.partition(second)
    return before, between, after


def observation_ids(tokenizer, observations, role="tool"):
    """The ids that follow a sampled assistant turn (which ended with the EOS token) to add one turn of `role`
    per text of `observations` and open the next assistant turn, separators included."""
    before, between, after = turn_texts(tokenizer, tokenizer.chat_template, tokenizer.eos_token, role)
    return tokenizer.encode(before + between.join(observations) + after, add_special_tokens=False)["input_ids"]
