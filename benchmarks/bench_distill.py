"""Samples to held-out accuracy: on-policy distillation (reverse_kl and gkd) against GRPO on the tiny demo's world.

    python -m llm.tools.tiny_demo --distill        # once: the SFT model (student), the GRPO policy (teacher), the data
    python benchmarks/bench_distill.py             # the three runs, greedy accuracy every 10 steps
    python benchmarks/bench_distill.py --every 5 --distill_steps 30

Both start from the demo's SFT model with the same prompts (8 per step, 8 samples each) and evaluate greedily on
the 200 held-out prompts every --every steps. GRPO is config/tiny/grpo_argument.json with the in-process `arith`
rule as its reward (the demo scores through the reward server; the rule is the same). Distillation is
config/tiny/distill_argument.json (rl_algorithm on_policy_distill, the GRPO policy as the teacher), once with
its distill_loss reverse_kl and once with gkd, with the same rule given only to evaluate: their advantages take
nothing from the reward. Prints one line per evaluation (samples drawn so far, each run's accuracy), the samples
each run needed to close half and 90% of the gap between the student's and the teacher's accuracy (first
reached, and held to the end of the run), and last
`reverse_kl_samples_to_half_gap=<n> gkd_samples_to_half_gap=<n> grpo_samples_to_half_gap=<n>`.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

from llm.alignment.ppo.run_ppo import build_trainer  # noqa: E402
from plot_curves import read_scalars  # noqa: E402  (this folder's)

GRPO_CONFIG, DISTILL_CONFIG = "config/tiny/grpo_argument.json", "config/tiny/distill_argument.json"
RUNS = ("reverse_kl", "gkd", "grpo")


def accuracy_curve(name, args, work):
    """{samples drawn: held-out greedy accuracy} of one run, evaluated every --every steps."""
    output = os.path.join(work, name)
    argv = [GRPO_CONFIG if name == "grpo" else DISTILL_CONFIG, "--actor_model_name_or_path", args.model, "--train_datasets", args.train, "--eval_datasets", args.eval,
            "--use_rm_server", "false", "--use_rule_reward", "true", "--reward_task", "arith", "--output_dir", output,
            "--logging_dir", os.path.join(output, "vdl_log"), "--save_steps", "0", "--evaluation_strategy", "steps",
            "--eval_steps", str(args.every)]
    if name != "grpo":
        argv += ["--distill_loss", name, "--teacher_model_name_or_path", args.teacher, "--max_steps", str(args.distill_steps)]
    elif args.grpo_steps:
        argv += ["--max_steps", str(args.grpo_steps)]
    trainer = build_trainer(argv)
    samples_per_step = trainer.args.per_device_prompt_batch_size * trainer.args.rollout_n
    trainer.train()
    return {step * samples_per_step: value for step, value in read_scalars(os.path.join(output, "vdl_log"))["eval/accuracy"]}


def samples_to(curve, target):
    """(the fewest samples after which the accuracy reached `target`, the fewest after which it stayed there to
    the end of the run); None: never."""
    points = sorted(curve)
    reached = next((samples for samples in points if curve[samples] >= target), None)
    held = next((samples for i, samples in enumerate(points) if all(curve[later] >= target for later in points[i:])), None)
    return reached, held


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=10, help="evaluate every this many steps")
    parser.add_argument("--distill_steps", type=int, default=50, help="distillation steps (the config's 50)")
    parser.add_argument("--grpo_steps", type=int, default=0, help="GRPO steps (default: the config's 300)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--model", default="tiny_demo/checkpoints/sft")
    parser.add_argument("--teacher", default="tiny_demo/checkpoints/grpo/policy")
    parser.add_argument("--train", default="tiny_demo/data/rl/train.jsonl")
    parser.add_argument("--eval", default="tiny_demo/data/rl/eval.jsonl")
    args = parser.parse_args()
    for path in (args.model, args.teacher):
        if not os.path.isdir(path):
            sys.exit(f"no model at {path}: run `python -m llm.tools.tiny_demo --distill` first")
    print(describe())
    work = args.work or tempfile.mkdtemp(prefix="bench_distill_")
    curves = {name: accuracy_curve(name, args, work) for name in RUNS}
    teacher = teacher_accuracy(args, work)
    student = curves["grpo"][0]
    print("\nsamples | " + " | ".join(f"{name} accuracy" for name in RUNS))
    for samples in sorted(set().union(*curves.values())):
        print(f"{samples} | " + " | ".join(f"{curves[name][samples]:.3f}" if samples in curves[name] else "-" for name in RUNS))
    print(f"student (SFT) accuracy {student:.3f}, teacher (GRPO policy) accuracy {teacher:.3f}")
    reached = {}
    for share in (0.5, 0.9):
        target = student + share * (teacher - student)
        reached[share] = {name: samples_to(curve, target) for name, curve in curves.items()}
        print(f"samples to close {share:.0%} of the gap (accuracy {target:.3f}), first reached / held to the end: "
              + ", ".join(f"{name} {reached[share][name][0]} / {reached[share][name][1]}" for name in RUNS))
    print(" ".join(f"{name}_samples_to_half_gap={reached[0.5][name][0]}" for name in RUNS))


def teacher_accuracy(args, work):
    """The teacher's held-out greedy accuracy: an evaluation-only run of it (do_eval without do_train)."""
    output = os.path.join(work, "teacher")
    trainer = build_trainer([GRPO_CONFIG, "--actor_model_name_or_path", args.teacher, "--train_datasets", args.train,
                             "--eval_datasets", args.eval, "--use_rm_server", "false", "--use_rule_reward", "true",
                             "--reward_task", "arith", "--output_dir", output, "--logging_dir", os.path.join(output, "vdl_log"),
                             "--do_train", "false", "--do_eval", "true"])
    return trainer.evaluate()["eval_accuracy"]


if __name__ == "__main__":
    main()
