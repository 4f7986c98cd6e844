"""The `<think>...</think><answer>...</answer>` response format that kk and the GSM8K recipe reward.

The prompt may open the think block itself (PaddleNLP's kk prompts end with `<think>`); the response is
then read as if it began with it.
"""

import re

from paddle_alignment.chat_format import END_OF_TEXT, IM_END

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# Alternatives start with distinct characters, so matching is linear.
_ONLY_END_MARKS = re.compile(r"(?:\s|" + re.escape(IM_END) + "|" + re.escape(END_OF_TEXT) + r")*")


def opens_think(src):
    return src.rstrip().endswith(THINK_OPEN)


def extract_answer(src, response):
    """The text inside <answer></answer> when each tag appears once and in order, else None."""
    text = THINK_OPEN + response if opens_think(src) else response
    if any(text.count(tag) != 1 for tag in TAGS):
        return None
    positions = [text.find(tag) for tag in TAGS]
    if positions != sorted(positions):
        return None
    return text[positions[2] + len(ANSWER_OPEN) : positions[3]]


def extract_answer_strictly(src, response):
    """`extract_answer`, for a response that opens the think block the prompt leaves open and ends at </answer>."""
    answer = extract_answer(src, response)
    if answer is None or not (opens_think(src) or response.lstrip().startswith(THINK_OPEN)):
        return None
    answer_end = response.rfind(ANSWER_CLOSE) + len(ANSWER_CLOSE)
    return answer if _ONLY_END_MARKS.fullmatch(response, answer_end) else None


def has_exact_format(src, response):
    """`<think>reasoning</think> <answer>answer</answer>` and nothing else: `extract_answer_strictly`'s form
    (each tag once, in order, only whitespace before <think> and only end tokens after </answer>) with only
    whitespace between the blocks."""
    if extract_answer_strictly(src, response) is None:
        return False
    return not response[response.find(THINK_CLOSE) + len(THINK_CLOSE) : response.find(ANSWER_OPEN)].strip()
