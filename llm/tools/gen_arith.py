"""Data of the tiny demo task: sums of three single digits, `a+b+c=` -> `a+b+c`.

Writes, from one shuffle of all 1000 prompts:
  rl/train.jsonl   prompts for RL (src/tgt)
  rl/eval.jsonl    held-out prompts (never seen in SFT or RL) for greedy accuracy
  sft/train.json   demonstrations for SFT, a fraction of them wrong (a careless annotator)
  sft/dev.json     correct demonstrations on held-out prompts, for the SFT eval loss

The wrong demonstrations make the realistic setting where RL with a verifiable reward gains quickly:
the SFT model has learnt the format and roughly the sums, and rewards sharpen it onto the right answer.
"""

import argparse
import itertools
import json
import os
import random


def arith_rows(triples):
    return [{"src": f"{a}+{b}+{c}=", "tgt": str(a + b + c)} for a, b, c in triples]


def noisy_demonstrations(triples, num_samples, error_rate, error_offsets, rng):
    """`num_samples` demonstrations drawn from `triples`; with probability `error_rate` the answer is off by an offset."""
    rows = []
    for _ in range(num_samples):
        a, b, c = rng.choice(triples)
        answer = a + b + c
        if rng.random() < error_rate:
            answer = max(0, answer + rng.choice(error_offsets))
        rows.append({"src": f"{a}+{b}+{c}=", "tgt": str(answer)})
    return rows


def write_jsonl(rows, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def generate(output_dir, num_eval=200, num_sft=20000, error_rate=0.3, error_offsets=(1, 2, -1, -2), seed=0):
    rng = random.Random(seed)
    triples = list(itertools.product(range(10), repeat=3))
    rng.shuffle(triples)
    eval_triples, train_triples = triples[:num_eval], triples[num_eval:]
    write_jsonl(arith_rows(train_triples), os.path.join(output_dir, "rl", "train.jsonl"))
    write_jsonl(arith_rows(eval_triples), os.path.join(output_dir, "rl", "eval.jsonl"))
    demos = noisy_demonstrations(train_triples, num_sft, error_rate, list(error_offsets), rng)
    write_jsonl(demos, os.path.join(output_dir, "sft", "train.json"))
    write_jsonl(arith_rows(eval_triples), os.path.join(output_dir, "sft", "dev.json"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_eval", type=int, default=200)
    parser.add_argument("--num_sft", type=int, default=20000)
    parser.add_argument("--error_rate", type=float, default=0.3)
    parser.add_argument("--error_offsets", default="1,2,-1,-2", help="comma-separated offsets of wrong answers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    offsets = [int(x) for x in args.error_offsets.split(",")]
    generate(args.output_dir, args.num_eval, args.num_sft, args.error_rate, offsets, args.seed)
    print(f"demo data written to {args.output_dir}/rl and {args.output_dir}/sft")


if __name__ == "__main__":
    main()
