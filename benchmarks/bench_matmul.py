"""float32 matrix products on the CPU (paddle.matmul), in GFLOP/s, under the current environment.

    python benchmarks/bench_matmul.py [--seconds 0.3]

Shapes M x K x N: the tiny demo's MLP over one micro-batch (64 x 24 tokens) and at a decode step (64 rows),
the 47M model's at a decode step, and a large square product. The CPU settings of llm/paddle_alignment/cpu_runtime.py are
applied first (PADDLE_ALIGNMENT_CPU_RUNTIME=off measures Paddle's defaults). Each shape: best of 5 timings
of repeated products. Last line: gflops_geomean=<n>, the geometric mean over the shapes.
"""

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402

SHAPES = [(1536, 128, 512), (64, 128, 512), (64, 512, 512), (1536, 512, 128), (2048, 2048, 2048)]


def gflops(m, k, n, seconds):
    a, b = paddle.randn([m, k]), paddle.randn([k, n])
    flops = 2.0 * m * k * n
    started, reps = time.perf_counter(), 0
    while time.perf_counter() - started < seconds / 5:  # warm-up, and the number of products per timing
        paddle.matmul(a, b)
        reps += 1
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(reps):
            c = paddle.matmul(a, b)
        float(c[0, 0])
        best = min(best, (time.perf_counter() - started) / reps)
    return flops / best / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=0.3, help="about how long each timing runs")
    args = parser.parse_args()
    paddle.set_device("cpu")
    print(describe())
    figures = []
    for m, k, n in SHAPES:
        figures.append(gflops(m, k, n, args.seconds))
        print(f"{m}x{k}x{n}: {figures[-1]:.0f} GFLOP/s", flush=True)
    print(f"gflops_geomean={math.exp(sum(map(math.log, figures)) / len(figures)):.0f}")


if __name__ == "__main__":
    main()
