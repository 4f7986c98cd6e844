"""Token-in-token-out across turns: the ids appended after a sampled assistant turn, never a re-rendered history.

Decoding a trajectory, re-applying the chat template and encoding again does not give back the ids that were
sampled (BPE is not a bijection; templates trim, add system prompts, drop separators: verl #6501, TRL #5224,
slime #2263), and the importance ratios then describe tokens nobody sampled. So a multi-turn trajectory is
the sampled ids as sampled, and between turns only the ids of the new turn: what the chat template renders
after an assistant turn's end-of-turn token (its separator included) for the observation turns and the
opening of the next assistant turn. They are found by rendering a fixed conversation followed by the new turns,
so each observation reads as the template writes it: JSON-encoded where Llama 3.1's template encodes tool
answers, trimmed where it trims user turns. Only the text after the assistant turn's end counts: a template may
render the earlier turns otherwise once more follow (Qwen3's drops an empty thinking block), and the sampled ids
of those turns stay as sampled. Special tokens split the text, so encoding the new turns alone gives the ids they
get inside the whole conversation.
"""

from paddle_alignment.chat_template import render_chat

PROBE_ANSWER = "probe answer 5c1e"  # found nowhere else in a rendered conversation
PROBE_CONVERSATION = ({"role": "user", "content": "?"}, {"role": "assistant", "content": PROBE_ANSWER})


class TemplateError(ValueError):
    """The chat template does not render a conversation's new turns after an assistant turn's end."""


def observation_text(tokenizer, observations, role="tool"):
    """What the chat template renders after an assistant turn's end-of-turn token (the tokenizer's EOS) for one
    turn of `role` per text of `observations`, and the opening of the next assistant turn."""
    eos = tokenizer.eos_token
    messages = [*PROBE_CONVERSATION, *({"role": role, "content": text} for text in observations)]
    rendered = render_chat(tokenizer, messages, add_generation_prompt=True)
    answer = rendered.find(PROBE_ANSWER)
    if answer < 0:
        raise TemplateError(f"the chat template does not render a {role!r} turn after an assistant turn's end")
    end = rendered.find(eos, answer)
    if end < 0:
        raise TemplateError(f"the chat template ends no assistant turn with the EOS token {eos!r}")
    return rendered[end + len(eos):]


def observation_ids(tokenizer, observations, role="tool"):
    """The ids that follow a sampled assistant turn (which ended with the EOS token) to add one turn of `role`
    per text of `observations` and open the next assistant turn, separators included."""
    return tokenizer.encode(observation_text(tokenizer, observations, role), add_special_tokens=False)["input_ids"]
