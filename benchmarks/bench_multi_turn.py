"""What carrying the KV cache from turn to turn could save in multi-turn rollouts: the seconds each turn's decode
spends re-prefilling the trajectory so far, against the rest of the rollout.

    python benchmarks/bench_multi_turn.py                         # the tool demo's policy and calc tool
    python benchmarks/bench_multi_turn.py --model PATH --batches 5 [-- --key value ...]
    python benchmarks/bench_multi_turn.py --prefill_model PATH --rows 16 --history 256,1024,2048

Each turn of a multi-turn rollout decodes from the whole trajectory so far (agents/trajectories.py): its prefill
computes again the KV cache of the prompt, the earlier turns and the observations, where a carried cache would
prefill only the observation. The first mode runs --batches rollout batches of config/tiny/grpo_tool_argument.json
(arguments after `--` override it) with the tool demo's SFT policy (`python -m llm.tools.tiny_demo --tools`
makes it) twice, with the KV cache carried from turn to turn and with every turn re-prefilling the trajectory,
and prints, per batch: the rollout's seconds, the first turn's prefill, the later turns' prefills and the
decode steps.

The second mode (--prefill_model) measures at a real model's shape what one re-prefill costs: the seconds to
prefill --rows rows of each --history length, against one decode step of those rows, and against the start
of a turn that carries the cache (the rows' caches taken, the next decoder built from them and a --block
token observation prefilled), on the fast decode path (a random Qwen2.5-0.5B from
llm/tools/build_real_model.py, float32, say). Prints `key=value` lines.
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

import paddle  # noqa: E402

from paddle_alignment.models import static_cache_decoder  # noqa: E402
from paddle_alignment.rollout import worker as rollout_worker  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_tool_argument.json")
TOOL_SFT = os.path.join(REPO_ROOT, "tiny_demo", "checkpoints", "sft-tools")


def timed_turns(seconds):
    """Wrap the worker's per-turn decode and the decoder's prefill: seconds["turn k prefill"] and
    seconds["turn k decode"] add up each turn's prefill and the rest of its decode (k counted per rollout)."""
    turn = [0]
    sample, prefill = rollout_worker.sample_turn, static_cache_decoder.StaticCacheDecoder.prefill

    def timed_prefill(self, input_ids):
        started = time.perf_counter()
        try:
            return prefill(self, input_ids)
        finally:
            seconds[f"turn {turn[0]} prefill"] += time.perf_counter() - started

    def timed_sample(*args, **kwargs):
        turn[0] += 1
        started = time.perf_counter()
        before = seconds[f"turn {turn[0]} prefill"]
        try:
            return sample(*args, **kwargs)
        finally:
            prefilled = seconds[f"turn {turn[0]} prefill"] - before
            seconds[f"turn {turn[0]} decode"] += time.perf_counter() - started - prefilled

    rollout_worker.sample_turn = timed_sample
    static_cache_decoder.StaticCacheDecoder.prefill = timed_prefill
    return turn


ORIGINALS = (rollout_worker.sample_turn, static_cache_decoder.StaticCacheDecoder.prefill)


def restore_turns():
    rollout_worker.sample_turn, static_cache_decoder.StaticCacheDecoder.prefill = ORIGINALS


def rollout_mode(args):
    from llm.alignment.ppo.run_ppo import build_trainer

    work = tempfile.mkdtemp(prefix="bench_multi_turn_")
    trainer = build_trainer([
        CONFIG, "--actor_model_name_or_path", args.model, "--eval_datasets", "", "--output_dir", os.path.join(work, "out"),
        "--logging_dir", os.path.join(work, "vdl"), *args.overrides,
    ])
    worker, dataset = trainer.rollout.worker, trainer.train_dataset
    size = trainer.args.per_device_prompt_batch_size
    worker.generate([dataset[i] for i in range(size)], seed=0)  # warm-up
    print(f"model: {args.model}")
    print(describe())
    carries = static_cache_decoder.StaticCacheDecoder.carries_cache
    for carry in (True, False):
        static_cache_decoder.StaticCacheDecoder.carries_cache = staticmethod(lambda model, carry=carry: carry and carries(model))
        seconds = defaultdict(float)
        turn = timed_turns(seconds)
        rollout_seconds, turns = 0.0, []
        for batch in range(args.batches):
            turn[0] = 0
            started = time.perf_counter()
            exp = worker.generate([dataset[i] for i in range(size * (batch + 1), size * (batch + 2))], seed=batch + 1)
            rollout_seconds += time.perf_counter() - started
            turns.append(float(exp.turn_stats[:, 0].mean()))
        restore_turns()
        first_prefill = seconds["turn 1 prefill"]
        later_prefill = sum(v for k, v in seconds.items() if k.endswith("prefill") and k != "turn 1 prefill")
        decode = sum(v for k, v in seconds.items() if k.endswith("decode"))
        per = 1000 / args.batches
        name = "carried" if carry else "re-prefilled"
        print(f"KV cache {name}: {args.batches} batches of {size} prompts x {trainer.args.rollout_n}, "
              f"{sum(turns) / len(turns):.2f} turns per trajectory; per batch: rollout {rollout_seconds * per:.0f} ms = "
              f"first-turn prefill {first_prefill * per:.0f} ms + later turns' prefill {later_prefill * per:.0f} ms + "
              f"decode steps {decode * per:.0f} ms + tools and the rest "
              f"{(rollout_seconds - first_prefill - later_prefill - decode) * per:.0f} ms")
        print(f"{name.replace('-', '')}_rollout_ms={rollout_seconds * per:.0f}")


def prefill_mode(args):
    from paddle_alignment.models.loading import load_policy
    from paddle_alignment.models.static_cache_decoder import StaticCacheDecoder

    model, _ = load_policy(args.prefill_model, dtype="float32")
    vocab = model.config.vocab_size
    print(f"model: {args.prefill_model} ({sum(int(p.numel()) for p in model.parameters()) / 1e6:.0f}M parameters)")
    print(describe())
    with paddle.no_grad():
        for history in args.history:
            ids = paddle.randint(0, vocab, [args.rows, history], dtype="int64")
            mask = paddle.ones([args.rows, history], "int64")
            started = time.perf_counter()
            decoder = StaticCacheDecoder(model, args.rows, history + args.steps + 1, mask, carry=True)
            setup = time.perf_counter() - started  # the weights gathered for the native op: every turn's decoder does it
            started = time.perf_counter()
            logits = decoder.prefill(ids)
            prefill = time.perf_counter() - started
            tokens = logits.argmax(axis=-1)
            started = time.perf_counter()
            for _ in range(args.steps):
                tokens = decoder.step(tokens).argmax(axis=-1)
            step = (time.perf_counter() - started) / args.steps
            # The next turn with the cache carried: take the rows' caches, build the decoder, prefill the block.
            started = time.perf_counter()
            caches = decoder.row_caches(list(range(args.rows)), [history + args.steps] * args.rows)
            block = paddle.randint(0, vocab, [args.rows, args.block], dtype="int64")
            carried = StaticCacheDecoder.continuing(model, caches, paddle.ones([args.rows, args.block], "int64"), args.steps)
            carried.prefill(block)
            carry = time.perf_counter() - started - setup
            print(f"history={history} rows={args.rows} decoder_setup_s={setup:.3f} prefill_s={prefill:.3f} "
                  f"decode_step_s={step:.4f} prefill_in_decode_steps={prefill / step:.1f} carried_turn_start_s={carry:.3f} "
                  f"(the caches taken and a {args.block}-token block prefilled; the decoder's setup, which both ways "
                  "pay, left out)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=TOOL_SFT, help="policy of the rollout mode (default: the tool demo's SFT model)")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--prefill_model", default=None, help="a model folder: measure prefill against decode steps instead")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--history", default="256,1024,2048", help="comma-separated history lengths to prefill")
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed after each prefill")
    parser.add_argument("--block", type=int, default=32, help="tokens a carried turn prefills (an observation)")
    parser.add_argument("overrides", nargs="*", help="config overrides of the rollout mode, e.g. -- --max_turns 3")
    args = parser.parse_args()
    args.history = [int(value) for value in args.history.split(",")]
    if args.prefill_model:
        prefill_mode(args)
    else:
        rollout_mode(args)


if __name__ == "__main__":
    main()
