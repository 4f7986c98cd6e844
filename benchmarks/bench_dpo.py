"""DPO steps of run_dpo.py and of TRL's DPOTrainer (with --trl_python) on the same model, pairs and machine, side
by side in one run: seconds per step, pair tokens per second, and the steps' peak RSS; with the reference run
online, or with its log-probs precomputed (ours: read from the on-disk cache a first run wrote; TRL: its
precompute_ref_log_probs at the start of training).

    python benchmarks/bench_dpo.py --work /tmp/bench_dpo --model tiny --trl_python /path/to/trl/venv/bin/python
    python benchmarks/bench_dpo.py --work /tmp/bench_dpo --model qwen2.5-0.5b --trl_python ... [--precompute]

Models, written once under --work in Hugging Face's layout, which both trainers load, float32: `tiny`, the
demo's model shape (4 layers, hidden 128, the project's byte-level tokenizer) with random weights;
`qwen2.5-0.5b`, a random Qwen2.5-0.5B (llm/tools/build_real_model.py: 24 layers, hidden 896, vocabulary 151,936,
tied embeddings; `--layers` cuts it). Pairs: --pairs_per_step x (--warmup + --steps) rows of a prompt of exactly
--prompt_tokens tokens and two replies of exactly --response_tokens tokens each (numbers, so that the counts are
exact), each reply + EOS; TRL's `prompt`/`chosen`/`rejected` strings, which run_dpo reads as they are. A step:
--pairs_per_step pairs in micro-batches of --micro_batch pairs, sigmoid loss, beta 0.1, AdamW, no recompute or
gradient checkpointing (TRL's default is on; --recompute turns it on for both), no logging, saving or
evaluation. Each trainer runs in its own process; the first --warmup steps are not timed, and each peak RSS
is the timed steps' own (the kernel's high-water mark reset when they start).

The work differs in how it is laid out, not in what it computes: TRL runs prompt + chosen and prompt +
rejected as two padded rows, each through the whole LM head; run_dpo runs prompt, chosen and rejected as one
packed row (the prompt once) and the LM head over the reply positions only, a chunk at a time. Tokens per
second count the pairs' own tokens (prompt + chosen + rejected) for both.

Prints `key=value` lines; the last is ours_vs_trl=<TRL's seconds per step over ours> with --trl_python.
"""

import argparse
import json
import os
import subprocess
import sys
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCHMARKS)
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, BENCHMARKS)

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

from bench_real_size import numbers_prompt, peak_rss_gb, reset_peak_rss, step_peak_rss_gb  # noqa: E402

CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "dpo_argument.json")


def build_model(args):
    """The model folder under --work (made once, in subprocesses: their memory is not the benchmark's)."""
    model = os.path.join(args.work, f"{args.model}-{args.layers}l" if args.model != "tiny" else "tiny")
    if os.path.isfile(os.path.join(model, "config.json")):
        return model
    if args.model == "tiny":
        paddle_folder = os.path.join(args.work, "tiny-paddle")
        tokenizer = os.path.join(args.work, "tokenizer")
        for command in (
            ["-m", "llm.tools.build_tokenizer", "--output_dir", tokenizer],
            ["-m", "llm.tools.build_tiny_model", "--tokenizer_dir", tokenizer, "--output_dir", paddle_folder],
            [os.path.join(REPO_ROOT, "llm", "tools", "export_hf.py"), "--model_name_or_path", paddle_folder, "--output_dir", model],
        ):
            subprocess.run([sys.executable, *command], check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    else:
        command = [sys.executable, os.path.join(REPO_ROOT, "llm", "tools", "build_real_model.py"), "--name", args.model,
                   "--num_layers", str(args.layers), "--dtype", "float32", "--output_dir", model]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return model


def build_pairs(args, model):
    """The pairs file: prompts of exactly --prompt_tokens tokens, replies of exactly --response_tokens (+ EOS)."""
    count = args.pairs_per_step * (args.warmup + args.steps)
    path = os.path.join(args.work, f"pairs-{count}x{args.prompt_tokens}x{args.response_tokens}-{os.path.basename(model)}.jsonl")
    if not os.path.isfile(path):
        from paddle_alignment.models.loading import pretrained_tokenizer

        tokenizer = pretrained_tokenizer(model)
        with open(path, "w") as out:
            for i in range(count):
                texts = [numbers_prompt(tokenizer, n, seed=3 * i + k) for k, n in
                         enumerate((args.prompt_tokens, args.response_tokens, args.response_tokens))]
                out.write(json.dumps(dict(zip(("prompt", "chosen", "rejected"), texts))) + "\n")
    return path


def run_ours(args, model, pairs):
    """run_dpo's steps in this process; prints a JSON line of its figures."""
    from paddlenlp.trainer import TrainerCallback

    from llm.alignment.dpo.run_dpo import build_trainer

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_begin(self, train_args, state, control, **kwargs):
            if state.global_step == args.warmup and not self.ends:
                reset_peak_rss()
                self.ends.append(time.perf_counter())

        def on_step_end(self, train_args, state, control, **kwargs):
            if self.ends:
                self.ends.append(time.perf_counter())

    length = args.prompt_tokens + 2 * args.response_tokens + 2
    started = time.perf_counter()
    trainer = build_trainer([
        CONFIG, "--model_name_or_path", model, "--train_dataset_path", pairs, "--dev_dataset_path", "",
        "--output_dir", os.path.join(args.work, "out"), "--logging_dir", os.path.join(args.work, "vdl"),
        "--max_seq_len", str(length), "--max_prompt_len", str(args.prompt_tokens),
        "--per_device_train_batch_size", str(args.micro_batch),
        "--gradient_accumulation_steps", str(args.pairs_per_step // args.micro_batch),
        "--max_steps", str(args.warmup + args.steps), "--learning_rate", "1e-6", "--warmup_ratio", "0",
        "--evaluation_strategy", "no", "--save_strategy", "no", "--logging_steps", "1000", "--report_to", "none",
        "--disable_tqdm", "true", "--recompute", "true" if args.recompute else "false",
        "--precompute_ref_log_probs", "true" if args.precompute else "false",
        "--reference_cache_dir", os.path.join(args.work, "reference_cache"),
    ])
    prepared = time.perf_counter() - started
    if args.cache_only:  # the reference log-probs are in the cache now
        print(json.dumps({"prepare_seconds": prepared, "reference_forwards": trainer.reference.forwards}))
        return
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    steps = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
    records = trainer.train_dataset.records
    tokens = sum(len(r.prompt) + len(r.chosen) + len(r.rejected) for r in records) / len(records)
    print(json.dumps({
        "seconds": sum(steps) / len(steps), "peak_rss_gb": step_peak_rss_gb(), "process_peak_rss_gb": peak_rss_gb(),
        "prepare_seconds": prepared, "reference_loaded": trainer.reference.model is not None,
        "reference_forwards": trainer.reference.forwards, "tokens_per_pair": tokens,
    }))


def run_trl(args, model, pairs):
    command = [args.trl_python, os.path.join(BENCHMARKS, "bench_trl_dpo.py"), "--model", model, "--pairs", pairs,
               "--pairs_per_step", str(args.pairs_per_step), "--micro_batch", str(args.micro_batch),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(os.cpu_count())]
    command += ["--precompute"] * args.precompute + ["--gradient_checkpointing"] * args.recompute
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"TRL's run failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    lines = result.stdout.strip().splitlines()
    return lines, dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the model, the pairs and the reference cache")
    parser.add_argument("--model", default="tiny", help="tiny, or a build_real_model.py name (qwen2.5-0.5b)")
    parser.add_argument("--layers", type=int, default=24, help="layers of a real-shape model")
    parser.add_argument("--prompt_tokens", type=int, default=512)
    parser.add_argument("--response_tokens", type=int, default=512)
    parser.add_argument("--pairs_per_step", type=int, default=2)
    parser.add_argument("--micro_batch", type=int, default=1, help="pairs per forward")
    parser.add_argument("--steps", type=int, default=2, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--precompute", action="store_true", help="reference log-probs precomputed (ours: from the cache)")
    parser.add_argument("--recompute", action="store_true", help="recompute (TRL: gradient checkpointing) for both")
    parser.add_argument("--trl_python", default=None, help="a Python with TRL (bench_trl_dpo.py) for TRL's figures")
    parser.add_argument("--internal_ours", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache_only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pairs_per_step % args.micro_batch:
        sys.exit("--pairs_per_step must be a multiple of --micro_batch")
    os.makedirs(args.work, exist_ok=True)
    model = build_model(args)
    pairs = build_pairs(args, model)
    if args.internal_ours:
        return run_ours(args, model, pairs)
    print(f"work: {args.model}, {args.pairs_per_step} pairs a step in micro-batches of {args.micro_batch}, prompts of "
          f"{args.prompt_tokens} tokens, replies of {args.response_tokens} (+ EOS), reference "
          f"{'precomputed' if args.precompute else 'online'}, recompute {'on' if args.recompute else 'off'}")
    command = [sys.executable, os.path.abspath(__file__), "--internal_ours", *sys.argv[1:]]
    if args.precompute:  # a first run writes the cache; the measured one reads it, as a second run of a user's does
        first = subprocess.run(command + ["--cache_only"], capture_output=True, text=True)
        if first.returncode != 0:
            sys.exit(f"our precomputation failed:\n{first.stderr[-6000:]}")
        cached = json.loads(first.stdout.strip().splitlines()[-1])
        print(f"ours: the reference log-probs precomputed by a first run in {cached['prepare_seconds']:.1f} s "
              f"({cached['reference_forwards']} forwards, setup included)")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"our run failed:\n{result.stderr[-6000:]}")
    ours = json.loads(result.stdout.strip().splitlines()[-1])
    tokens = args.pairs_per_step * ours["tokens_per_pair"]
    print(f"ours: {ours['tokens_per_pair']:.0f} tokens a pair; reference model loaded: {ours['reference_loaded']}, "
          f"reference forwards: {ours['reference_forwards']}; setup {ours['prepare_seconds']:.1f} s; peak RSS of the "
          f"whole process {ours['process_peak_rss_gb']:.2f} GB")
    print(f"ours_seconds_per_step={ours['seconds']:.2f}")
    print(f"ours_tokens_per_s={tokens / ours['seconds']:.0f}")
    print(f"ours_peak_rss_gb={ours['peak_rss_gb']:.2f}")
    if args.trl_python:
        lines, trl = run_trl(args, model, pairs)
        print(f"trl: {lines[0]}; {float(trl['data_tokens_per_pair']):.0f} tokens a pair; setup {float(trl['prepare_seconds']):.1f} s, "
              f"training {float(trl['train_seconds']):.1f} s (precomputation and warm-up included)")
        seconds = float(trl["seconds_per_step"])
        print(f"trl_seconds_per_step={seconds:.2f}")
        print(f"trl_tokens_per_s={tokens / seconds:.0f}")
        print(f"trl_peak_rss_gb={float(trl['peak_rss_gb']):.2f}")
        print(f"ours_vs_trl={seconds / ours['seconds']:.2f}")


if __name__ == "__main__":
    main()
