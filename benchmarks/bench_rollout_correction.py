"""The demo's GRPO stage with each rollout correction, and with a rollout/trainer gap injected on purpose.

    python -m llm.tools.tiny_demo                                     # once: the SFT model and the data
    python benchmarks/bench_rollout_correction.py                     # none and every correction, no gap
    python benchmarks/bench_rollout_correction.py --sampler_temperature 1.5 --settings none,token_tis,icepop

Each run is config/tiny/grpo_argument.json from the demo's SFT model (300 steps of 8 prompts x 8 samples,
the in-process rule reward) with `rollout_correction` set as named ("none": unset). With
--sampler_temperature T the fast decode loop samples at T while the trainer's log-probs stay at the
config's temperature: the sampler draws from another policy than the trainer computes, as bfloat16
kernels or a stale engine would make it, and records the log-probs it drew with. Prints per run the held-out
greedy accuracy after training and the `rollout_corr/*` metrics averaged over the logged steps, then one
table of each run's metrics at every 50th step (the curves of its VisualDL log), and last
`min_eval_accuracy=<a>`, the lowest of the runs. --model, --train and --eval point it at another world.
"""

import argparse
import dataclasses
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

from llm.alignment.ppo.run_ppo import build_trainer  # noqa: E402
from paddle_alignment.algos import ROLLOUT_CORRECTIONS  # noqa: E402
from paddle_alignment.rollout import worker as rollout_worker  # noqa: E402
from plot_curves import read_scalars  # noqa: E402  (this folder's)

CONFIG = "config/tiny/grpo_argument.json"
SHOWN = ("rollout_corr/is_ratio_mean", "rollout_corr/logprob_diff_mean", "rollout_corr/k3_kl", "rollout_corr/weight_mean",
         "accuracy")


def sampler_at(temperature):
    """Make every rollout worker sample at `temperature` (greedy evaluation unchanged)."""
    original = rollout_worker.SamplingConfig.from_args.__func__

    def from_args(cls, args, greedy=False):
        config = original(cls, args, greedy)
        return config if greedy else dataclasses.replace(config, temperature=temperature)

    rollout_worker.SamplingConfig.from_args = classmethod(from_args)


def train_scalars(log_dir):
    """{tag: {step: value}} of the `train/` scalars in the VisualDL logs of `log_dir`."""
    return {tag[len("train/"):]: dict(points) for tag, points in read_scalars(log_dir).items() if tag.startswith("train/")}


def run(setting, args, work):
    """Train with `setting`; returns (held-out greedy accuracy after training, the run's train scalars)."""
    output = os.path.join(work, setting)
    argv = [CONFIG, "--actor_model_name_or_path", args.model, "--train_datasets", args.train, "--eval_datasets", args.eval,
            "--use_rm_server", "false", "--use_rule_reward", "true", "--output_dir", output,
            "--logging_dir", os.path.join(output, "vdl_log"), "--save_steps", "0",
            "--rollout_correction", "" if setting == "none" else setting]
    if args.steps:  # logged at least once
        argv += ["--max_steps", str(args.steps), "--logging_steps", str(min(10, args.steps))]
    build_trainer(argv).train()
    with open(os.path.join(output, "eval_results.json")) as f:
        return json.load(f)["eval_accuracy"], train_scalars(os.path.join(output, "vdl_log"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(["none", *ROLLOUT_CORRECTIONS.names()]))
    parser.add_argument("--sampler_temperature", type=float, default=None)
    parser.add_argument("--steps", type=int, default=0, help="max_steps (default: the config's 300)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--model", default="tiny_demo/checkpoints/sft")
    parser.add_argument("--train", default="tiny_demo/data/rl/train.jsonl")
    parser.add_argument("--eval", default="tiny_demo/data/rl/eval.jsonl")
    args = parser.parse_args()
    if not os.path.isdir(args.model):
        sys.exit(f"no model at {args.model}: run `python -m llm.tools.tiny_demo` first (this starts from its SFT model and data)")
    print(describe())
    if args.sampler_temperature:
        sampler_at(args.sampler_temperature)
        print(f"injected gap: the sampler draws at temperature {args.sampler_temperature}, the trainer computes at the config's")
    work = args.work or tempfile.mkdtemp(prefix="bench_rollout_correction_")
    curves, accuracies = {}, []
    for setting in args.settings.split(","):
        accuracy, curves[setting] = run(setting, args, work)
        accuracies.append(accuracy)
        means = {key: sum(values.values()) / len(values) for key, values in curves[setting].items() if key.startswith("rollout_corr/")}
        print(f"{setting}: eval_accuracy={accuracy:.4f} " + " ".join(f"{k.split('/')[-1]}={v:.4g}" for k, v in sorted(means.items())), flush=True)
    print("\nevery 50th step: " + ", ".join(SHOWN))
    for setting, curve in curves.items():
        for step in sorted(curve["rollout_corr/k3_kl"]):
            if step % 50 == 0:
                print(f"{setting} step {step}: " + " ".join(f"{curve.get(key, {}).get(step, float('nan')):.4g}" for key in SHOWN))
    print(f"min_eval_accuracy={min(accuracies):.4f}")


if __name__ == "__main__":
    main()
