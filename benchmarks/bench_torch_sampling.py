"""PyTorch's sampling at the shapes and settings csrc/gpu/check_kernels.py times the CUDA sampling kernel at:
the comparison in csrc/README.md ("The CUDA kernels on a GPU").

    python3 benchmarks/bench_torch_sampling.py [--device cuda] [--rows 16 256] [--vocab 151936] [--repeats 50]

What it times is what Hugging Face's `TopKLogitsWarper` and `TopPLogitsWarper` and then `torch.multinomial`
do, and so TRL's and transformers' `generate(do_sample=True)`: the k-th largest logit by `torch.topk`, a
sort of each row for top-p, softmax, cumulative sum, the mask scattered back, and a draw. Logits are float32,
normal with scale 4 as in check_kernels.py, temperature 1. It needs PyTorch and NumPy, not Paddle (a GPU
machine with CUDA and PyTorch has them; on the CPU, `--device cpu`); CI does not run it.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "gpu"))
from check_kernels import TIMED_SETTINGS  # noqa: E402  (top_k, top_p) of the CUDA kernel's timings


def sample(logits, top_k, top_p):
    """One token a row, as the warpers and torch.multinomial draw it."""
    if top_k > 0:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(logits, descending=False)
        removed = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        removed[:, -1] = False  # the most likely token stays
        logits = logits.masked_fill(removed.scatter(1, order, removed), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1)


def milliseconds_per_call(logits, top_k, top_p, repeats):
    for _ in range(3):  # warm-up
        sample(logits, top_k, top_p)
    if logits.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        sample(logits, top_k, top_p)
    if logits.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    generator = torch.Generator(device="cpu").manual_seed(0)
    for rows in args.rows:
        logits = (torch.randn(rows, args.vocab, generator=generator) * 4).to(args.device)
        for top_k, top_p in TIMED_SETTINGS:
            milliseconds = milliseconds_per_call(logits, top_k, top_p, args.repeats)
            print(f"torch sampling {rows} x {args.vocab}, top_k {top_k}, top_p {top_p}: {milliseconds:.3f} ms")


if __name__ == "__main__":
    main()
