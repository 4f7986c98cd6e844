"""Rollout throughput: the fast decode loop (static KV cache + paddlenlp_ops) vs paddlenlp generate().

    python csrc/setup_cpu.py install      # once: builds paddlenlp_ops
    python benchmarks/bench_rollout.py [--repeats 3] [--rollout_n 1] [--new_tokens 128]

Batch 64 (64 / rollout_n prompts, rollout_n samples of each: GRPO's groups, whose prompt the fast loop
prefills once), exactly --new_tokens new tokens per row (EOS forbidden until then), temperature 1.0, top-p 0.9, on
randomly initialised Qwen2 models with the demo's byte tokenizer: the tiny config (4 layers, hidden
128, ~1M parameters) and a ~50M-parameter config (12 layers, hidden 512). One warm-up run each, then
the best of --repeats. One line per config, printed as soon as it is measured (the 50M config takes
minutes); paddlenlp's info logs are silenced. Last line: speedup_vs_generate=<ratio> for the tiny config.
The CPU settings of llm/paddle_alignment/cpu_runtime.py are applied first.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402
from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from paddlenlp.utils.log import logger  # noqa: E402

from llm.tools.build_tiny_model import build_tiny_model  # noqa: E402
from llm.tools.build_tokenizer import build_tokenizer  # noqa: E402
from paddle_alignment.rollout.decode import SamplingConfig, generate_rollouts, rollout_ops  # noqa: E402

CONFIGS = {
    "tiny": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2),
    "50M": dict(hidden_size=512, num_layers=12, num_heads=8, num_kv_heads=4),
}
BATCH = 64


def tokens_per_second(model, tokenizer, items, n, new_tokens, use_fast, repeats):
    sampling = SamplingConfig(max_dec_len=new_tokens, min_dec_len=new_tokens, temperature=1.0, top_p=0.9)
    generate_rollouts(model, tokenizer, items, n, sampling, use_fast=use_fast)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        exp = generate_rollouts(model, tokenizer, items, n, sampling, use_fast=use_fast)
        best = min(best, time.perf_counter() - started)
    assert int(exp.response_mask.sum()) == BATCH * new_tokens
    return BATCH * new_tokens / best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default="50M,tiny", help="comma-separated subset of " + ",".join(CONFIGS))
    parser.add_argument("--rollout_n", type=int, default=1, help="samples of each prompt (a divisor of 64)")
    parser.add_argument("--new_tokens", type=int, default=128)
    args = parser.parse_args()
    if args.rollout_n < 1 or BATCH % args.rollout_n:
        parser.error(f"--rollout_n {args.rollout_n} is not a divisor of the batch of {BATCH}")
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        parser.error(f"--configs names unknown configs {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    if args.new_tokens < 1:
        parser.error(f"--new_tokens {args.new_tokens} must be at least 1")
    if rollout_ops() is None:
        sys.exit("paddlenlp_ops with the rollout ops is not installed: run python csrc/setup_cpu.py install")
    paddle.set_device("cpu")
    logger.set_level("WARNING")
    print(describe(), flush=True)
    work = tempfile.mkdtemp(prefix="bench_rollout_")
    build_tokenizer(os.path.join(work, "tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(work, "tokenizer"))
    prompts = [f"{i % 10}+{i % 7}+{i % 3}=" for i in range(BATCH // args.rollout_n)]
    items = [{"prompt": p, "label": "0", "input_ids": tokenizer(p)["input_ids"]} for p in prompts]
    speedups = {}
    for name in args.configs.split(","):
        path = os.path.join(work, name)
        build_tiny_model(os.path.join(work, "tokenizer"), path, **CONFIGS[name])
        model = AutoModelForCausalLM.from_pretrained(path)
        params = sum(int(p.numel()) for p in model.parameters())
        fast = tokens_per_second(model, tokenizer, items, args.rollout_n, args.new_tokens, True, args.repeats)
        slow = tokens_per_second(model, tokenizer, items, args.rollout_n, args.new_tokens, False, args.repeats)
        speedups[name] = fast / slow
        print(f"{name} ({params / 1e6:.1f}M params): fast {fast:.0f} tok/s, generate {slow:.0f} tok/s, x{fast / slow:.2f}", flush=True)
    if "tiny" in speedups:
        print(f"speedup_vs_generate={speedups['tiny']:.2f}")


if __name__ == "__main__":
    main()
