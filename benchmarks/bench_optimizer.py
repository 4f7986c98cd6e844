"""One optimizer step (global-norm clip + AdamW) of a tiny Qwen2 on the CPU: Paddle's classes against the
fused ones of llm/paddle_alignment/fused_optimizer.py, in ms per step.

    python benchmarks/bench_optimizer.py [--hidden_size 128] [--layers 4] [--rounds 3] [--steps 100]

The model has the demo policy's shape by default (about 1M parameters in 50 tensors, vocabulary 259);
its gradients are fixed random values, clipped to norm 1, weights but biases and norms decayed (the
trainer's AdamW). The variants run in alternating rounds; each prints its best round. Last line:
speedup=<Paddle's ms / fused ms>.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402
from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from paddle_alignment.fused_optimizer import (  # noqa: E402
    FusedAdamW,
    FusedClipGradByGlobalNorm,
    decay_filter,
    optimizer_ops,
)

VARIANTS = {"paddle": (paddle.optimizer.AdamW, paddle.nn.ClipGradByGlobalNorm), "fused": (FusedAdamW, FusedClipGradByGlobalNorm)}


def tiny_qwen2(hidden_size, layers):
    config = Qwen2Config(
        vocab_size=259, hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden_size // 32), num_key_value_heads=max(1, hidden_size // 64),
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def ms_per_step(model, gradients, variant, steps):
    """Mean time of `steps` steps, each from `gradients` (norm above 1, so that each step clips)."""
    optimizer_cls, clip_cls = VARIANTS[variant]
    optimizer = optimizer_cls(
        learning_rate=1e-4, parameters=model.parameters(), weight_decay=0.01,
        apply_decay_param_fun=decay_filter(model), grad_clip=clip_cls(1.0),
    )
    seconds = 0.0
    for step in range(3 + steps):  # 3 untimed: accumulators created, caches warm
        for p, g in gradients:
            paddle.assign(g, p.grad)
        started = time.perf_counter()
        optimizer.step()
        seconds += (time.perf_counter() - started) * (step >= 3)
    return seconds / steps * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    if optimizer_ops() is None:
        sys.exit("the fused optimizer ops are not available: python csrc/setup_cpu.py install")
    print(describe())
    paddle.seed(0)
    model = tiny_qwen2(args.hidden_size, args.layers)
    parameters = [p for p in model.parameters() if not p.stop_gradient]
    gradients = [(p, paddle.randn(p.shape) * 0.01) for p in parameters]
    for p, g in gradients:
        p.grad = g.clone()
    print(f"{sum(p.size for p in parameters)} parameters in {len(parameters)} tensors")
    best = {variant: float("inf") for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            best[variant] = min(best[variant], ms_per_step(model, gradients, variant, args.steps))
    for variant, ms in best.items():
        print(f"{variant}: {ms:.2f} ms per step (clip + AdamW)")
    print(f"speedup={best['paddle'] / best['fused']:.2f}")


if __name__ == "__main__":
    main()
