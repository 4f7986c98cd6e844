"""Time and peak memory of loading one model from its Hugging Face-layout folder and from the same model
in Paddle's layout, each in a fresh process.

    python benchmarks/bench_loading.py --name qwen2.5-0.5b --num_layers 2 [--dtype float32] [--rounds 2]

The folders are built first under --work_dir by llm/tools/build_real_model.py (random weights, bfloat16,
as the hub ships them) unless they are there. Each load is the trainer's (loading.pretrained_causal_lm)
in `--dtype`; the layouts alternate over the rounds and each prints its best. Last line:
speedup=<Paddle layout's seconds / Hugging Face layout's>.
"""

import argparse
import os
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO_ROOT)

LOAD = (
    "import resource, sys, time\n"
    "from paddle_alignment.models.loading import pretrained_causal_lm\n"
    "start = time.perf_counter()\n"
    "pretrained_causal_lm(sys.argv[1], dtype=sys.argv[2])\n"
    "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)\n"
)


def ensure_folders(name, num_layers, work_dir):
    from llm.tools.build_real_model import build_real_model

    folders = {layout: os.path.join(work_dir, f"{name}-{num_layers or 'all'}layers-{layout}") for layout in ("hf", "paddle")}
    for layout, folder in folders.items():
        if not os.path.isdir(folder):
            build_real_model(name, folder, num_layers, layout=layout)
    return folders


def load_once(folder, dtype):
    """(seconds, peak RSS in GB) of loading `folder` in a new process."""
    result = subprocess.run(
        [sys.executable, "-c", LOAD, folder, dtype], cwd=REPO_ROOT, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, "llm")),
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    seconds, peak = result.stdout.split()[-2:]
    return float(seconds), float(peak)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="qwen2.5-0.5b")
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "paddle_alignment_bench_loading"))
    args = parser.parse_args()
    folders = ensure_folders(args.name, args.num_layers, args.work_dir)
    best = {}
    for _ in range(args.rounds):
        for layout, folder in folders.items():
            seconds, peak = load_once(folder, args.dtype)
            best[layout] = min(best.get(layout, (seconds, peak)), (seconds, peak))
    for layout, (seconds, peak) in best.items():
        print(f"{layout:7s} {seconds:6.2f} s  peak RSS {peak:5.2f} GB  ({folders[layout]})")
    print(f"speedup={best['paddle'][0] / best['hf'][0]:.2f}")


if __name__ == "__main__":
    main()
