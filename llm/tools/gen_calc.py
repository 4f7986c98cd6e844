"""Data of the tiny tool task: products of two two-digit numbers, `37*84=` -> `3108`, with a `calc` tool.

A 1M-parameter model does not learn two-digit multiplication from a few thousand examples, but it learns to
call `calc` and copy its answer. Writes, from one shuffle of all 8100 products:
  rl/train.jsonl  prompts for RL (src: the chat prompt, tgt: the product)
  rl/eval.jsonl   held-out prompts for greedy accuracy
  sft/train.json  demonstrations: a `tool_rate` fraction call the tool (two rows: the prompt -> the call,
                  and the conversation up to the tool's answer -> the product), the others write the
                  product straight away
  sft/dev.json    tool demonstrations on the held-out prompts, for the SFT eval loss

SFT teaches the format and the tool, but greedy decoding mostly answers without it (most demonstrations
do); GRPO with the tool then learns to call it, while GRPO without it cannot get past guessing.
"""

import argparse
import itertools
import os
import random

from llm.tools.gen_arith import write_jsonl
from paddle_alignment.chat_format import chat_prompt, render_chat, tool_call_text


def question(a, b):
    return f"{a}*{b}="


def tool_demonstration(a, b):
    """The two SFT rows of a demonstration that calls the tool: the call, and the answer after the tool's."""
    call = tool_call_text("calc", {"expression": f"{a}*{b}"})
    conversation = [
        {"role": "user", "content": question(a, b)},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": str(a * b)},
    ]
    return [{"src": chat_prompt(question(a, b)), "tgt": call}, {"src": render_chat(conversation), "tgt": str(a * b)}]


def demonstrations(pairs, num_samples, tool_rate, rng):
    rows = []
    for _ in range(num_samples):
        a, b = rng.choice(pairs)
        if rng.random() < tool_rate:
            rows += tool_demonstration(a, b)
        else:
            rows.append({"src": chat_prompt(question(a, b)), "tgt": str(a * b)})
    return rows


def prompt_rows(pairs):
    return [{"src": chat_prompt(question(a, b)), "tgt": str(a * b)} for a, b in pairs]


def generate(output_dir, num_eval=200, num_sft=6000, tool_rate=0.3, seed=0):
    rng = random.Random(seed)
    pairs = list(itertools.product(range(10, 100), repeat=2))
    rng.shuffle(pairs)
    eval_pairs, train_pairs = pairs[:num_eval], pairs[num_eval:]
    write_jsonl(prompt_rows(train_pairs), os.path.join(output_dir, "rl", "train.jsonl"))
    write_jsonl(prompt_rows(eval_pairs), os.path.join(output_dir, "rl", "eval.jsonl"))
    write_jsonl(demonstrations(train_pairs, num_sft, tool_rate, rng), os.path.join(output_dir, "sft", "train.json"))
    write_jsonl([row for a, b in eval_pairs for row in tool_demonstration(a, b)], os.path.join(output_dir, "sft", "dev.json"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_eval", type=int, default=200)
    parser.add_argument("--num_sft", type=int, default=6000, help="demonstrations (a tool one is two rows)")
    parser.add_argument("--tool_rate", type=float, default=0.3, help="fraction of demonstrations that call the tool")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generate(args.output_dir, args.num_eval, args.num_sft, args.tool_rate, args.seed)
    print(f"tool task data written to {args.output_dir}/rl and {args.output_dir}/sft")


if __name__ == "__main__":
    main()
