"""TRL's DPOTrainer on the work of benchmarks/bench_dpo.py, which runs this script with TRL's Python and prints
its figures beside the project's:

    TRL_PYTHON benchmarks/bench_trl_dpo.py --model DIR --pairs FILE --pairs_per_step 2 --micro_batch 1 \\
        --steps 2 --warmup 1 [--precompute] [--gradient_checkpointing] [--threads 2]

The model is a Hugging Face folder used as it is, float32, loaded twice (policy and reference); the pairs a
jsonl of `prompt`/`chosen`/`rejected` strings (TRL's standard format, used as written: no chat template),
TRL appending EOS to the replies as the project does. One step is `--pairs_per_step` pairs in micro-batches of
`--micro_batch` pairs (gradient accumulation over the rest), the sigmoid loss with beta 0.1, AdamW, no
truncation (max_length None), no logging, saving or evaluation, bf16 off; gradient checkpointing (TRL's
default on) only with --gradient_checkpointing. With --precompute the reference log-probs of the whole data
set are computed before training (TRL's precompute_ref_log_probs; their time is printed apart).

It needs torch, transformers, TRL, datasets and accelerate, in a virtualenv of their own (see
benchmarks/bench_trl_grpo.py; measured with TRL 1.16.0, transformers 5.24, torch 2.13 CPU). Prints `key=value`
lines: seconds_per_step (the mean over the timed steps after --warmup), peak_rss_gb (the timed steps' own, the
kernel's high-water mark reset when they start), precompute_seconds, and the tokens TRL's rows held.
"""

import argparse
import os
import sys
import tempfile
import time

import torch
import transformers
import trl
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import DPOConfig, DPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_real_size import reset_peak_rss, step_peak_rss_gb  # noqa: E402  (standard library only at import)


class StepTimer(TrainerCallback):
    """Step boundaries after `warmup` steps, and the peak RSS from the first timed step on."""

    def __init__(self, warmup):
        self.warmup, self.ends = warmup, []

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.warmup and not self.ends:
            reset_peak_rss()
            self.ends.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        if self.ends:
            self.ends.append(time.perf_counter())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", required=True)
    parser.add_argument("--pairs_per_step", type=int, default=2)
    parser.add_argument("--micro_batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precompute", action="store_true")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    args = parser.parse_args()
    if args.pairs_per_step % args.micro_batch:
        sys.exit("--pairs_per_step must be a multiple of --micro_batch")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, threads {torch.get_num_threads()}")

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    dataset = load_dataset("json", data_files=args.pairs, split="train")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = DPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_dpo_"), per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.pairs_per_step // args.micro_batch, max_steps=args.warmup + args.steps,
        learning_rate=1e-6, beta=0.1, loss_type=["sigmoid"], max_length=None, precompute_ref_log_probs=args.precompute,
        precompute_ref_batch_size=args.micro_batch, gradient_checkpointing=args.gradient_checkpointing, bf16=False,
        use_cpu=True, report_to=[], logging_strategy="no", save_strategy="no", eval_strategy="no", seed=42,
        dataloader_drop_last=True,
    )
    timer = StepTimer(args.warmup)
    started = time.perf_counter()
    trainer = DPOTrainer(model=model, ref_model=reference, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[timer])
    prepared = time.perf_counter() - started
    rows = trainer.train_dataset
    tokens = sum(len(row[key]) for row in rows for key in ("prompt_ids", "chosen_ids", "rejected_ids") if key in row)
    started = time.perf_counter()
    trainer.train()
    trained = time.perf_counter() - started
    steps = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
    if len(steps) != args.steps:
        sys.exit(f"timed {len(steps)} steps, expected {args.steps}")
    print(f"data_tokens_per_pair={tokens / len(rows):.1f}")
    print(f"prepare_seconds={prepared:.1f}")
    print(f"train_seconds={trained:.1f}")
    print(f"seconds_per_step={sum(steps) / len(steps):.2f}")
    print(f"peak_rss_gb={step_peak_rss_gb():.2f}")


if __name__ == "__main__":
    main()
