"""End-to-end GRPO step throughput on the tiny config: completions per second after warm-up.

    python benchmarks/bench_grpo.py [--model PATH] [--steps 20] [--warmup 5]

One step is the whole GRPO step of config/tiny/grpo_argument.json (8 prompts x 8 samples = 64
completions): rollout, rule reward, log-probs, advantages, update. The model is the demo's SFT
checkpoint (tiny_demo/checkpoints/sft, made by `python -m llm.tools.tiny_demo`) when present, else a
freshly built random tiny Qwen2 of the same shape (its responses run to max_dec_len, so it is slower).
The reward is the in-process rule reward, so no HTTP time is counted. Last line: completions_per_s=<n>.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from llm.alignment.ppo.run_ppo import build_trainer  # noqa: E402
from llm.tools.build_tiny_model import build_tiny_model  # noqa: E402
from llm.tools.build_tokenizer import build_tokenizer  # noqa: E402
from llm.tools.gen_arith import generate  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")
DEMO_SFT = os.path.join(REPO_ROOT, "tiny_demo", "checkpoints", "sft")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_SFT if os.path.isdir(DEMO_SFT) else None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. -- --use_fusemt false")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench_grpo_")
    generate(os.path.join(work, "data"), num_sft=0)
    model = args.model
    if model is None:
        build_tokenizer(os.path.join(work, "tokenizer"))
        model = os.path.join(work, "model")
        build_tiny_model(os.path.join(work, "tokenizer"), model)
    trainer = build_trainer([
        CONFIG,
        "--actor_model_name_or_path", model,
        "--train_datasets", os.path.join(work, "data", "rl", "train.jsonl"),
        "--eval_datasets", "",
        "--output_dir", os.path.join(work, "out"),
        "--logging_dir", os.path.join(work, "vdl"),
        "--use_rm_server", "false",
        "--use_rule_reward", "true",
        "--max_steps", str(args.warmup + args.steps),
        *args.overrides,
    ])
    trainer.prepare_training()
    batches = trainer.endless_batches("train", trainer.train_dataset, trainer.args.per_device_prompt_batch_size)
    for _ in range(args.warmup):
        trainer.rl_step(batches)
    started = time.perf_counter()
    completions = 0
    for _ in range(args.steps):
        exp, _ = trainer.rl_step(batches)
        completions += len(exp)
    seconds = time.perf_counter() - started
    print(f"model: {model}")
    print(f"{args.steps} steps of {completions // args.steps} completions in {seconds:.2f}s ({seconds / args.steps:.3f} s/step)")
    print(f"completions_per_s={completions / seconds:.1f}")


if __name__ == "__main__":
    main()
