"""Per-rank peak memory of loading a model split over 1, 2 and 4 tensor-parallel ranks, each rank reading
only its part of the safetensors (models/split_loading.py), against loading the whole model and splitting
it (what a Paddle-pickle folder still does).

    python benchmarks/bench_tp_loading.py [--name qwen2.5-7b] [--num_layers 1] [--degrees 1 2 4] [--whole_degrees 2]

The Hugging Face-layout folder is built first under --work_dir by llm/tools/build_real_model.py (random
weights, bfloat16, as the hub ships them) unless it is there, or --model names a safetensors folder. Each load runs in fresh processes
(`paddle.distributed.launch --nproc_per_node <degree>`), in float32 as the trainer loads; the whole-then-split
way only at --whole_degrees (every rank holds the whole model: at TP4 four copies would not fit 24 GiB). Prints,
per degree and way, the largest rank's resident memory added by the load (peak RSS after it less RSS before
it; the safetensors pages a rank reads count), the bytes of that rank's parameters, and the seconds; last
line: `split_peak_gb=<per degree>`.
"""

import argparse
import glob
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "llm"))


def current_rss_gb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def load_on_this_rank(folder, degree, way):
    """One rank's load (run under launch); prints `added_gb parameter_gb seconds`."""
    import paddle.distributed as dist
    from paddle.distributed import fleet

    from paddle_alignment.distributed import rendezvous_each_gloo_group_apart
    from paddle_alignment.models.loading import causal_lm_class, from_folder, split_from_folder
    from paddle_alignment.models.tensor_parallel import local_value, shard_model

    if degree > 1:
        rendezvous_each_gloo_group_apart()
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": degree, "pp_degree": 1}
        fleet.init(is_collective=True, strategy=strategy)
    options = {"dtype": "float32"}
    before, start = current_rss_gb(), time.perf_counter()
    if way == "split":
        model = split_from_folder(folder, causal_lm_class, options, degree)
    else:
        model = shard_model(from_folder(folder, causal_lm_class, options), degree)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    held = sum(local_value(p)._numel() * local_value(p).element_size() for p in model.parameters()) / 2**30
    print(f"RANK_LOAD {dist.get_rank()} {peak - before:.3f} {held:.3f} {seconds:.2f}", flush=True)


def launch_ranks(script, argv, degree, work_dir, marker, what):
    """`script argv` over `degree` processes (`paddle.distributed.launch`; one: run directly): the values after the
    rank on each rank's line that starts with `marker`, as floats; `what` names the run in the error if it fails."""
    log_dir = tempfile.mkdtemp(prefix=f"tp{degree}-", dir=work_dir)
    command = [sys.executable, os.path.abspath(script), *argv]
    if degree > 1:
        command[1:1] = ["-m", "paddle.distributed.launch", "--nproc_per_node", str(degree), "--log_dir", log_dir]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(REPO_ROOT, "llm"))
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    # Under launch each rank writes its worker log (and the launcher echoes rank 0's): read the logs.
    logs = [open(path, errors="replace").read() for path in glob.glob(os.path.join(log_dir, "workerlog.*"))]
    outputs = logs if degree > 1 else [result.stdout]
    lines = [line.split()[2:] for text in outputs for line in text.splitlines() if line.startswith(marker)]
    if result.returncode != 0 or len(lines) != degree:
        raise RuntimeError(f"{what} failed:\n" + "\n".join(text[-3000:] for text in [result.stderr, *outputs]))
    return [tuple(float(value) for value in line) for line in lines]


def launch(folder, degree, way, work_dir):
    """[(added_gb, parameter_gb, seconds)] of each rank of one load at `degree`."""
    argv = ["--load", folder, "--degree", str(degree), "--way", way]
    return launch_ranks(__file__, argv, degree, work_dir, "RANK_LOAD", f"the load at degree {degree} ({way})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a safetensors model folder (default: build --name)")
    parser.add_argument("--name", default="qwen2.5-7b")
    parser.add_argument("--num_layers", type=int, default=1)
    parser.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--whole_degrees", type=int, nargs="*", default=[2])
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "paddle_alignment_bench_tp_loading"))
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--degree", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=("split", "whole"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        load_on_this_rank(args.load, args.degree, args.way)
        return
    from llm.tools.build_real_model import build_real_model

    folder = args.model or os.path.join(args.work_dir, f"{args.name}-{args.num_layers or 'all'}layers-hf")
    if not os.path.isdir(folder):
        build_real_model(args.name, folder, args.num_layers)
    os.makedirs(args.work_dir, exist_ok=True)
    print(f"model: {folder} (float32 in memory; per rank, the largest of the ranks)")
    split_peaks = []
    for degree in args.degrees:
        # At degree 1 both ways are one whole load.
        for way in ["split"] + (["whole"] if degree > 1 and degree in args.whole_degrees else []):
            ranks = launch(folder, degree, way, args.work_dir)
            added, held, seconds = (max(values) for values in zip(*ranks))
            print(f"TP{degree} {way:5s}: load adds {added:6.2f} GB RSS per rank, parameters {held:6.2f} GB per rank, {seconds:6.1f} s")
            split_peaks += [f"{added:.2f}"] if way == "split" else []
    print("split_peak_gb=" + ",".join(split_peaks))


if __name__ == "__main__":
    main()
