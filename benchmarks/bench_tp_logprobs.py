"""Per-rank peak memory of the response tokens' log-probs and entropies, forward and backward, through an LM head
split over the vocabulary by tensor parallel: the whole logits at once against chunks of --chunk_tokens
(models/head_logprobs.py, `logprob_chunk_tokens`).

    python benchmarks/bench_tp_logprobs.py [--tokens 1024] [--hidden 896] [--vocab 8192] [--chunk_tokens 128] [--degree 2]

Each way runs in fresh processes (`paddle.distributed.launch --nproc_per_node <degree>`) on the same random hidden
states, head [hidden, vocab] split by columns and labels, at temperature 0.7. Prints, per way, the largest rank's
growth of peak RSS over the pass, its seconds, and the sums of the log-probs and entropies (the same for both
ways); last line: `chunked_over_whole_peak=<ratio>`. On CPU, Paddle's log_softmax of a distributed tensor runs
in a slow generic loop (about 5 us an element, 2026-11-27): keep tokens x vocab small there.
"""

import argparse
import os
import resource
import tempfile
import time

from bench_tp_loading import current_rss_gb, launch_ranks  # puts the repository and llm/ on sys.path

TEMPERATURE = 0.7


def pass_on_this_rank(args):
    """One rank's forward and backward (run under launch); prints `added_gb seconds logprob_sum entropy_sum`."""
    from paddle_alignment.cpu_runtime import configure_cpu_runtime

    configure_cpu_runtime()  # before paddle loads
    import numpy as np
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet

    from paddle_alignment.distributed import rendezvous_each_gloo_group_apart
    from paddle_alignment.models.head_logprobs import head_token_stats

    rendezvous_each_gloo_group_apart()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": args.degree, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    mesh = dist.ProcessMesh(list(range(args.degree)), dim_names=["mp"])
    rng = np.random.default_rng(0)

    def placed(array, placement, trained):
        tensor = dist.shard_tensor(paddle.to_tensor(array), mesh, [placement])
        tensor.stop_gradient = not trained
        return tensor

    hidden = placed(rng.standard_normal((1, args.tokens, args.hidden)).astype("float32"), dist.Replicate(), True)
    weight = placed((rng.standard_normal((args.hidden, args.vocab)) * 0.02).astype("float32"), dist.Shard(1), True)
    labels = placed(rng.integers(0, args.vocab, (1, args.tokens)), dist.Replicate(), False)
    before, start = current_rss_gb(), time.perf_counter()
    logprobs, entropy = head_token_stats(hidden, weight, False, labels, TEMPERATURE, args.chunk_tokens)
    (logprobs.sum() + entropy.sum()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"RANK_PASS {dist.get_rank()} {peak - before:.4f} {seconds:.2f} {float(logprobs.sum()):.6f} "
          f"{float(entropy.sum()):.6f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=8192, help="divisible by --degree")
    parser.add_argument("--chunk_tokens", type=int, default=128)
    parser.add_argument("--degree", type=int, default=2)
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "paddle_alignment_bench_tp_logprobs"))
    parser.add_argument("--rank_pass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_pass:
        pass_on_this_rank(args)
        return
    os.makedirs(args.work_dir, exist_ok=True)
    shape = ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--vocab", str(args.vocab), "--degree", str(args.degree)]
    print(f"TP{args.degree}: {args.tokens} tokens, head [{args.hidden}, {args.vocab}] split over the vocabulary "
          f"(per rank, the largest of the ranks)")
    peaks = {}
    for way, chunk_tokens in (("whole", 0), ("chunked", args.chunk_tokens)):
        ranks = launch_ranks(__file__, [*shape, "--chunk_tokens", str(chunk_tokens), "--rank_pass"], args.degree,
                             args.work_dir, "RANK_PASS", f"the {way} pass")
        added, seconds = (max(values) for values in list(zip(*ranks))[:2])
        logprob_sum, entropy_sum = ranks[0][2:]
        peaks[way] = added
        print(f"{way:7s} (logprob_chunk_tokens {chunk_tokens}): peak RSS +{added:.3f} GB, {seconds:.1f} s; "
              f"sums of the log-probs {logprob_sum:.4f} and entropies {entropy_sum:.4f}")
    print(f"chunked_over_whole_peak={peaks['chunked'] / peaks['whole']:.3f}")


if __name__ == "__main__":
    main()
