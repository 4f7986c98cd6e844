"""End-to-end GRPO step throughput on the tiny config: completions per second after warm-up.

    python benchmarks/bench_grpo.py [--model PATH | --random_model] [--steps 20] [--warmup 5] [-- --key value ...]
    python benchmarks/bench_grpo.py --random_model -- --max_dec_len 8 --min_dec_len 8 --kl_loss_coeff 0.04 --kl_estimator k3

One step is the whole GRPO step of config/tiny/grpo_argument.json (8 prompts x 8 samples = 64
completions): rollout, rule reward, log-probs, advantages, update; arguments after `--` override the
config's. The model is the demo's SFT checkpoint (tiny_demo/checkpoints/sft, made by
`python -m llm.tools.tiny_demo`) when present, else (or with --random_model) a freshly built random
tiny Qwen2 of the same shape (its responses run to max_dec_len, so it is slower). The reward is the
in-process rule reward, so no HTTP time is counted.

Prints the model used, the CPU settings (see llm/paddle_alignment/cpu_runtime.py), the seconds per step split into
rollout (sampling + rule reward), reference (reference and old log-prob passes, no gradient), values
(critic pass, PPO only), update (forward, backward and optimizer step of every micro-batch) and other
(advantages, metrics), then completions_per_s=<n> as the last line.

With `-- --rollout_mode decoupled` a sampler process samples, scores and computes the reference and
behaviour log-probs of the next batches while the trainer updates: "rollout" is then the trainer's wait
for a batch and "sampling" the sampler's generation time (overlapped with the update), and a line
gives the trainer's side of the weight-sync check per step (the probe's forward, within "other").
"""

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

from llm.alignment.ppo.run_ppo import build_trainer  # noqa: E402
from llm.tools.build_tiny_model import build_tiny_model  # noqa: E402
from llm.tools.build_tokenizer import build_tokenizer  # noqa: E402
from llm.tools.gen_arith import generate  # noqa: E402
from paddle_alignment.rollout import sync_check  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")
DEMO_SFT = os.path.join(REPO_ROOT, "tiny_demo", "checkpoints", "sft")
# Methods of the trainer and of its rollout worker timed per step, by phase. "reference" is every log-prob
# pass without gradient: the reference model's, and the actor's old log-probs where the algorithm needs them
# (compute_logprobs called inside compute_reference_logprobs is counted once).
PHASES = {"make_experience": "rollout", "compute_reference_logprobs": "reference", "compute_logprobs": "reference",
          "compute_teacher_logprobs": "teacher", "compute_values": "values", "update": "update"}
WORKER_METHODS = ("compute_reference_logprobs", "compute_logprobs", "compute_teacher_logprobs", "compute_values")


def time_phases(trainer):
    """Wrap the phase methods of the trainer instance and its rollout worker (these objects only) to add their wall time to the returned
    dict of phase -> seconds; nested calls count towards the outermost phase. Also returns a dict whose
    "sampling" adds up the rollouts' own sampling seconds (make_experience's report, rewards excluded)."""
    seconds, sampling = defaultdict(float), defaultdict(float)
    depth = [0]

    def timed(name, method):
        def wrapper(*args, **kwargs):
            depth[0] += 1
            started = time.perf_counter()
            try:
                result = method(*args, **kwargs)
                if name == "make_experience":
                    sampling["sampling"] += result[1]["rollout_seconds"]
                return result
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    seconds[PHASES[name]] += time.perf_counter() - started
        return wrapper

    for name in PHASES:
        owner = trainer.rollout.worker if name in WORKER_METHODS else trainer
        setattr(owner, name, timed(name, getattr(owner, name)))
    record = sync_check.record

    def timed_record(worker):  # the weight-sync check's side in the trainer (decoupled rollout), within its phase
        started = time.perf_counter()
        try:
            return record(worker)
        finally:
            sampling["sync check"] += time.perf_counter() - started

    sync_check.record = timed_record
    return seconds, sampling


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="policy checkpoint (default: the demo's SFT model if built)")
    parser.add_argument("--random_model", action="store_true", help="a random tiny Qwen2 of the demo's shape")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. -- --use_fusemt false")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench_grpo_")
    generate(os.path.join(work, "data"), num_sft=0)
    model = args.model
    if model is None and not args.random_model and os.path.isdir(DEMO_SFT):
        model = DEMO_SFT
    if model is None:
        build_tokenizer(os.path.join(work, "tokenizer"))
        model = os.path.join(work, "model")
        build_tiny_model(os.path.join(work, "tokenizer"), model)
        model_name = "random tiny Qwen2 (demo's shape)"
    else:
        model_name = model
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
    trainer.rollout.start(0, trainer.offload)
    try:
        for _ in range(args.warmup):
            trainer.advance(batches)
        phases, sampling = time_phases(trainer)
        started = time.perf_counter()
        completions = 0
        for _ in range(args.steps):
            exp, _ = trainer.advance(batches)
            completions += len(exp)
        seconds = time.perf_counter() - started
    finally:
        trainer.rollout.close()
    phases["other"] = seconds - sum(phases.values())
    print(f"model: {model_name}")
    print(describe())
    print(f"{args.steps} steps of {completions // args.steps} completions in {seconds:.2f}s ({seconds / args.steps:.3f} s/step)")
    split = ", ".join(f"{name} {1000 * value / args.steps:.0f} ms" for name, value in phases.items() if value or name != "values")
    print(f"per step: {split} (rollout: sampling {1000 * sampling['sampling'] / args.steps:.0f} ms + rule reward)")
    if sampling["sync check"]:
        print(f"weight-sync check, the trainer's side: {1000 * sampling['sync check'] / args.steps:.2f} ms a step")
    print(f"completions_per_s={completions / seconds:.1f}")


if __name__ == "__main__":
    main()
