"""What the weight-sync check of decoupled rollout costs per policy version, on each side.

    python benchmarks/bench_sync_check.py [--model PATH] [--versions 40]

The trainer's rollout worker (config/tiny/grpo_argument.json; the model a freshly built random tiny Qwen2 of
the demo's shape, or --model) publishes --versions policy versions into a folder, and a sampler's worker over
its own copy of the model loads each one, as in a decoupled run, alternately with `rollout_sync_check` on and
off (a folder each). Prints the medians of each side's seconds per version (the trainer: publish_weights, the probe's
forward included when on; the sampler: update_weights, load and verify), what the probe itself takes (its
floor: the pass each side must run), and the check's cost per side as the difference, `check_ms=<trainer +
sampler>` last. Set it beside the step of `bench_grpo.py -- --rollout_mode
decoupled` on the same machine: on a CPU the sampler shares the trainer's cores, so both sides count.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402

from bench_grpo import CONFIG  # noqa: E402
from bench_native_forward import timed  # noqa: E402
from llm.alignment.ppo.run_ppo import build_trainer  # noqa: E402
from llm.tools.build_tiny_model import build_tiny_model  # noqa: E402
from llm.tools.build_tokenizer import build_tokenizer  # noqa: E402
from llm.tools.gen_arith import generate  # noqa: E402
from paddle_alignment.models.loading import load_causal_lm  # noqa: E402
from paddle_alignment.models.native_forward import NativeDecoder  # noqa: E402
from paddle_alignment.rollout import sync_check  # noqa: E402
from paddle_alignment.rollout.worker import RolloutWorker  # noqa: E402

PROBE_CALLS = 200


def pair(model, work):
    """The trainer's rollout worker and a sampler's over its own copy of `model`, loaded as a sampler loads it."""
    trainer = build_trainer([
        CONFIG, "--actor_model_name_or_path", model,
        "--train_datasets", os.path.join(work, "data", "rl", "train.jsonl"),
        "--eval_datasets", "", "--output_dir", os.path.join(work, "out"), "--logging_dir", os.path.join(work, "vdl"),
        "--use_rm_server", "false", "--use_rule_reward", "true",
    ])
    sampler = RolloutWorker(trainer.args, load_causal_lm(model, trainer.args), trainer.tokenizer, reward_scorer=None)
    return trainer.rollout.worker, sampler


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None,
                        help="policy checkpoint (default: a random tiny Qwen2 of the demo's shape)")
    parser.add_argument("--versions", type=int, default=40)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_sync_check_")
    generate(os.path.join(work, "data"), num_sft=0)
    model = args.model
    if model is None:
        build_tokenizer(os.path.join(work, "tokenizer"))
        model = os.path.join(work, "model")
        build_tiny_model(os.path.join(work, "tokenizer"), model)
    trainer, sampler = pair(model, work)
    # A folder for each setting: a published file is reused only by versions of its own layout (weights.py).
    folders = {check: os.path.join(work, f"rollout-check-{check}") for check in (True, False)}
    for folder in folders.values():
        os.makedirs(folder)
    seconds = {(side, check): [] for side in ("trainer", "sampler") for check in (True, False)}
    with paddle.no_grad():
        for version in range(args.versions + 4):
            for check in (True, False):
                for worker in (trainer, sampler):
                    worker.args.rollout_sync_check = check
                started = time.perf_counter()
                trainer.publish_weights(folders[check], version, keep=2)
                published = time.perf_counter()
                sampler.update_weights(folders[check], version, 10, lambda: True, "rollout sampler 0 (cpu)")
                if version >= 4:  # warm-up: until published files are reused
                    seconds["trainer", check].append(published - started)
                    seconds["sampler", check].append(time.perf_counter() - published)
    print(f"model: {model}")
    print(describe())
    print(probe_floor(trainer))
    cost = {}
    for side in ("trainer", "sampler"):
        on, off = (1000 * statistics.median(seconds[side, check]) for check in (True, False))
        cost[side] = on - off
        print(f"{side}: {on:.2f} ms a version with the check, {off:.2f} ms without (medians of {args.versions})")
    print(f"check_ms={cost['trainer'] + cost['sampler']:.2f}")


def median_ms(call):
    return statistics.median(timed(call) for _ in range(PROBE_CALLS))


def probe_floor(worker):
    """The probe's log-probs alone, in words (medians of PROBE_CALLS calls): what each side computes per version,
    and, where the native op runs it, the part that is its forward."""
    with paddle.no_grad():
        whole = median_ms(lambda: sync_check.probe_logprobs(worker))
        native = NativeDecoder.for_model(worker.policy)
        if native is None:
            return f"the probe's log-probs alone: {whole:.2f} ms (the micro-batch pass)"
        probe, temperature = sync_check.NATIVE_PROBES[worker.policy], worker.sampling.temperature
        forward = median_ms(lambda: probe.logprobs(native, temperature))
        finding = median_ms(lambda: NativeDecoder.for_model(worker.policy))
    return (f"the probe's log-probs alone: {whole:.2f} ms, of which the native op's forward and the log-probs "
            f"{forward:.2f} ms, finding the op's weights {finding:.2f} ms (medians of {PROBE_CALLS})")


if __name__ == "__main__":
    main()
