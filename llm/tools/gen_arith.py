"""Data of the tiny demo task: sums of three single digits, `a+b+c=` -> `a+b+c`.

Writes, from one shuffle of all 1000 prompts:
  rl/train.jsonl   prompts for RL (src/tgt)
  rl/eval.jsonl    held-out prompts (never seen in SFT or RL) for greedy accuracy
  sft/train.json   demonstrations for SFT, a fraction of them wrong (a careless annotator)
  sft/dev.json     correct demonstrations on held-out prompts, for the SFT eval loss
  pref/train.jsonl preference pairs for reward-model training: the right sum against a wrong one (the
  pref/eval.jsonl  annotator's dropped carry and other slips), in random order (`better` says which is right);
                   eval on held-out prompts
  dpo/train.jsonl  the same pairs in PaddleNLP's DPO format ({"src", "tgt", "response", "sort"}), for run_dpo.py
  dpo/dev.jsonl
  kto/train.jsonl  the same pairs made unpaired for run_kto.py: each reply a row, `sort` [1] if right, [0] if not,
  kto/dev.jsonl    in a seeded shuffle

The demonstrations come from a careless annotator: on sums that carry (>= 10) it drops the carry with
probability `carry_slip_rate` (writing 13 as 3), and any answer is off by one with probability `error_rate`.
SFT learns the format and the sums, but also the slips, which greedy decoding then repeats; the right
answers are still sampled often, so RL with a verifiable reward corrects the model quickly -- the
realistic setting of RL after SFT on partly wrong demonstrations.
"""

import argparse
import itertools
import json
import os
import random


def arith_rows(triples):
    return [{"src": f"{a}+{b}+{c}=", "tgt": str(a + b + c)} for a, b, c in triples]


def careless_answer(total, carry_slip_rate, error_rate, rng):
    if total >= 10 and rng.random() < carry_slip_rate:
        return total - 10
    if rng.random() < error_rate:
        return max(0, total + rng.choice([-1, 1]))
    return total


def noisy_demonstrations(triples, num_samples, carry_slip_rate, error_rate, rng):
    """`num_samples` demonstrations drawn from `triples`, answered by the careless annotator."""
    rows = []
    for _ in range(num_samples):
        a, b, c = rng.choice(triples)
        answer = careless_answer(a + b + c, carry_slip_rate, error_rate, rng)
        rows.append({"src": f"{a}+{b}+{c}=", "tgt": str(answer)})
    return rows


def wrong_answer(total, rng):
    """A wrong sum: the careless annotator's dropped carry on half of the carrying sums, else one of the
    other slips a policy makes (a spurious carry, off by one or two), so a reward model learns the sum
    itself rather than a shortcut such as the number of digits."""
    if total >= 10 and rng.random() < 0.5:
        return total - 10
    return rng.choice([w for w in (total + 10, total - 2, total - 1, total + 1, total + 2) if w >= 0])


def preference_rows(triples, rng, pairs_per_prompt=1):
    """Pairs in RawSample fields: `answer` and `other_answer`, `better` when `answer` is the right sum."""
    rows = []
    for a, b, c in [t for t in triples for _ in range(pairs_per_prompt)]:
        right, wrong = str(a + b + c), str(wrong_answer(a + b + c, rng))
        better = rng.random() < 0.5
        answer, other = (right, wrong) if better else (wrong, right)
        rows.append({"src": f"{a}+{b}+{c}=", "answer": answer, "other_answer": other, "better": better})
    return rows


def paddlenlp_pairs(rows):
    """Pair rows in PaddleNLP's DPO format: the replies in the rows' order, the right one sorted higher."""
    return [{"src": r["src"], "tgt": [], "response": [r["answer"], r["other_answer"]], "sort": [1, 0] if r["better"] else [0, 1]}
            for r in rows]


def unpaired_rows(rows, rng):
    """Each reply of the pair rows on a row of its own in PaddleNLP's KTO format, shuffled."""
    unpaired = [{"src": r["src"], "tgt": [], "response": [reply], "sort": [int(reply_is_better)]}
                for r in rows for reply, reply_is_better in ((r["answer"], r["better"]), (r["other_answer"], not r["better"]))]
    rng.shuffle(unpaired)
    return unpaired


def write_jsonl(rows, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def generate(output_dir, num_eval=200, num_sft=20000, carry_slip_rate=0.6, error_rate=0.1, seed=0):
    rng = random.Random(seed)
    triples = list(itertools.product(range(10), repeat=3))
    rng.shuffle(triples)
    eval_triples, train_triples = triples[:num_eval], triples[num_eval:]
    write_jsonl(arith_rows(train_triples), os.path.join(output_dir, "rl", "train.jsonl"))
    write_jsonl(arith_rows(eval_triples), os.path.join(output_dir, "rl", "eval.jsonl"))
    demos = noisy_demonstrations(train_triples, num_sft, carry_slip_rate, error_rate, rng)
    write_jsonl(demos, os.path.join(output_dir, "sft", "train.json"))
    write_jsonl(arith_rows(eval_triples), os.path.join(output_dir, "sft", "dev.json"))
    pairs = {"train": preference_rows(train_triples, rng, pairs_per_prompt=4), "eval": preference_rows(eval_triples, rng)}
    for split, name in (("train", "train"), ("eval", "dev")):
        write_jsonl(pairs[split], os.path.join(output_dir, "pref", f"{split}.jsonl"))
        write_jsonl(paddlenlp_pairs(pairs[split]), os.path.join(output_dir, "dpo", f"{name}.jsonl"))
        write_jsonl(unpaired_rows(pairs[split], rng), os.path.join(output_dir, "kto", f"{name}.jsonl"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_eval", type=int, default=200)
    parser.add_argument("--num_sft", type=int, default=20000)
    parser.add_argument("--carry_slip_rate", type=float, default=0.6, help="chance a carrying sum loses its carry")
    parser.add_argument("--error_rate", type=float, default=0.1, help="chance an answer is off by one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generate(args.output_dir, args.num_eval, args.num_sft, args.carry_slip_rate, args.error_rate, args.seed)
    print(f"demo data written to {args.output_dir}/rl, sft, pref, dpo and kto")


if __name__ == "__main__":
    main()
