"""Convert GSM8K jsonl (`question`, `answer` ending in `#### N`) into src/tgt jsonl for the math rewards.

Usage:
    python llm/tools/convert_gsm8k.py --input gsm8k/train.jsonl --output data/gsm8k/train.jsonl \
        [--prompt_style hash|think_answer]

`--prompt_style hash` (the default) asks for the reasoning and a last line `#### <number>` (the `math` and
`gsm8k_strict` rules); `think_answer` asks for `<think>reasoning</think><answer>number</answer>`, the
prompt of the GSM8K GRPO recipe (`math_think_answer`, config/qwen/grpo_gsm8k_argument.json).
"""

import argparse
import json
import re
import sys
from pathlib import Path

if not __package__:
    # Run as a script path: make the `llm` package importable from the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from paddle_alignment.chat_format import chat_prompt  # noqa: E402

SYSTEM_PROMPT = "You are a patient math tutor who solves grade-school word problems carefully."
INSTRUCTION = 'Reason step by step, then give the final answer on the last line as "#### <number>".'
THINK_ANSWER_SYSTEM_PROMPT = (
    "You solve grade-school math word problems. Reply in exactly this form and nothing else:\n"
    "<think>\nyour step-by-step reasoning\n</think>\n<answer>\nthe final number only\n</answer>"
)
PROMPT_STYLES = {"hash": (SYSTEM_PROMPT, INSTRUCTION), "think_answer": (THINK_ANSWER_SYSTEM_PROMPT, None)}

ANSWER_MARK = "####"
_FINAL_NUMBER = re.compile(r"\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*")


def convert_row(row, prompt_style="hash"):
    """{"question", "answer": "... #### 1,234"} -> {"src": chat prompt, "tgt": "1234"}."""
    if not isinstance(row, dict):
        raise ValueError(f"row must be a JSON object, got {type(row).__name__}")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str):
            raise ValueError(f"row lacks a string {key!r}")
    mark = row["answer"].rfind(ANSWER_MARK)
    if mark < 0:
        raise ValueError(f"answer has no {ANSWER_MARK!r}")
    final = _FINAL_NUMBER.fullmatch(row["answer"], mark + len(ANSWER_MARK))
    if final is None:
        raise ValueError(f"answer does not end in '{ANSWER_MARK} <number>'")
    system, instruction = PROMPT_STYLES[prompt_style]
    prompt = f"{row['question'].strip()}\n\n{instruction}" if instruction else row["question"].strip()
    return {"src": chat_prompt(prompt, system=system), "tgt": final[1].replace(",", "")}


def load_json(line):
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON: {error}") from None


def convert_file(input, output, prompt_style="hash"):
    """Convert every non-blank line of `input` into `output`; returns the number of rows written.

    Nothing is written when a line is bad: the ValueError names the file and line number.
    """
    converted = []
    with open(input, encoding="utf-8") as file:
        for line_number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                converted.append(convert_row(load_json(line), prompt_style))
            except ValueError as error:
                raise ValueError(f"{input}:{line_number}: {error}") from error
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    with open(output, "w", encoding="utf-8") as file:
        file.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in converted)
    return len(converted)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="GSM8K jsonl")
    parser.add_argument("--output", required=True, help="src/tgt jsonl to write")
    parser.add_argument(
        "--prompt_style", choices=sorted(PROMPT_STYLES), default="hash",
        help="hash: a last line '#### <number>' (math, gsm8k_strict); think_answer: <think>...</think><answer>...</answer> (math_think_answer)",
    )
    args = parser.parse_args(argv)
    try:
        count = convert_file(args.input, args.output, args.prompt_style)
    except (OSError, ValueError) as error:
        sys.exit(f"convert_gsm8k: {error}")
    print(f"wrote {count} rows to {args.output}")


if __name__ == "__main__":
    main()
