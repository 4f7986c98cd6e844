"""GRPO at a real model's shape: one step's seconds per phase, peak RSS against the static footprint, the
update's padded-versus-real tokens, and the decode loop against paddlenlp's generate() and the memory-
bandwidth limit; with --trl_python, TRL's GRPOTrainer on the same model, work and machine in the same run.

    python benchmarks/bench_real_size.py --work /tmp/real_size                      # 4 x 4, prompts 256, responses 512
    python benchmarks/bench_real_size.py --work /tmp/real_size --prompts 2 --samples 2 --new_tokens 2048 --recompute
    python benchmarks/bench_real_size.py --work /tmp/real_size --mode decode --new_tokens 64   # decode step, limits
    python benchmarks/bench_real_size.py --work /tmp/real_size --mode packing --rows 1 4 16   # packed weights or not
    ... --trl_python /path/to/venv/bin/python                                        # TRL's step beside ours
    ... --pipeline_parallel_degree 2        # also the step at PP2 over 2 processes: each rank's peak, the weight move
    ... --pipeline_parallel_degree 2 --eval_mode tensor_parallel   # the rollout's models split over the 2 stages' ranks
    ... --layers 2 --teacher_layers 24      # on-policy distillation: a 24-layer teacher scores a 2-layer student's samples

The model is a random Qwen2.5-0.5B (llm/tools/build_real_model.py: hidden 896, 24 layers, vocabulary
151,936, tied embeddings, 494M parameters; `--layers 2` cuts it to 166M), or the architecture `--name` gives
(qwen3-0.6b: its decode loop and no-gradient passes run Paddle's forward), float32, written once under
--work in Hugging Face's layout, which both trainers load. The prompts are --prompts texts of exactly
--prompt_tokens tokens (numbers, so that their token count is exact), each sampled --samples times. A
random model almost never samples EOS, so the responses are --new_tokens long; min_dec_len (TRL:
min_new_tokens) makes that exact, so both do the same work. The step is config/tiny/grpo_argument.json's
GRPO (token-mean, clip 0.2/0.28, k3 KL to a reference model with coefficient 0.04), one optimizer step
over the batch in micro-batches of --micro_batch rows (TRL: per_device_train_batch_size, with
steps_per_generation = gradient_accumulation_steps), the in-process `arith` rule reward, float32, and
recompute (TRL: gradient_checkpointing) only with --recompute; with --share_prompt_forward our update runs
each prompt once for the samples of a micro-batch (share_prompt_forward). Each trainer runs in its own process,
so each peak RSS is its own; both time their first step (no warm-up: one real-size step takes minutes).

The static footprint is what a step must hold whatever its batch: the policy's weights, gradients and
AdamW's two moments (4 copies of its parameters) and the reference model's (and a teacher's) weights, in float32. Peak RSS
is the step's own (the kernel's high-water mark reset when the step starts, in each trainer's process),
so that loading a checkpoint does not count.
With --pipeline_parallel_degree N the same step also runs over N processes (`paddle.distributed.launch`),
the actor trained as N pipeline stages and the rollout on a whole copy per rank (eval_mode single), or, with
--eval_mode tensor_parallel, the rollout's actor and reference split over the N ranks; it prints each rank's
step peak RSS beside the one process's, and the seconds the stages' weights took to move into the rollout's
actor after the update.
With --teacher_layers N the step also distils from a teacher of the same architecture with N layers (its
log-probs of every sampled token, distill_coeff 1 beside the rule's GRPO advantages, docs/distillation.md), and
prints the teacher pass's share of the step (teacher_share_of_step).
Prints `key=value` lines; the last is ours_vs_trl=<ratio> with --trl_python.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCHMARKS)
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, BENCHMARKS)


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def reset_peak_rss():
    """Start the kernel's peak-RSS count (VmHWM) afresh: the step's peak, not the loading's (Linux)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def step_peak_rss_gb():
    """VmHWM since reset_peak_rss."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 2**20


def model_folder(args, layers):
    """The random model of --name with `layers` layers under --work (made once, in a subprocess: its memory is not ours)."""
    model = os.path.join(args.work, f"{args.name}-{layers}l")
    if not os.path.isfile(os.path.join(model, "config.json")):
        command = [sys.executable, os.path.join(REPO_ROOT, "llm", "tools", "build_real_model.py"), "--name", args.name,
                   "--num_layers", str(layers), "--dtype", "float32", "--output_dir", model]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return model


def build_world(args):
    """The model folder (and the teacher's with --teacher_layers) and the prompts file under --work."""
    model = model_folder(args, args.layers)
    if args.teacher_layers:
        model_folder(args, args.teacher_layers)
    prompts = os.path.join(args.work, f"prompts-{args.prompts}x{args.prompt_tokens}.jsonl")
    if not os.path.isfile(prompts):
        from paddle_alignment.models.loading import pretrained_tokenizer

        tokenizer = pretrained_tokenizer(model)
        with open(prompts, "w") as out:
            for i in range(args.prompts):
                out.write(json.dumps({"src": numbers_prompt(tokenizer, args.prompt_tokens, seed=i), "tgt": "0"}) + "\n")
    return model, prompts


def numbers_prompt(tokenizer, tokens, seed):
    """A text of exactly `tokens` tokens: numbers and spaces (Qwen's tokenizer gives each digit a token)."""
    import random

    rng = random.Random(seed)

    def count(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    text = "Sum:"
    while count(text) < tokens:
        # The first piece that adds tokens without passing the count (BPE may merge a piece into the last token).
        pieces = (f" {rng.randint(0, 9)}", str(rng.randint(0, 9)), ".", " ")
        text = next((text + piece for piece in pieces if count(text) < count(text + piece) <= tokens), None)
        if text is None:
            raise RuntimeError(f"could not write a prompt of exactly {tokens} tokens")
    if count(text) != tokens:
        raise RuntimeError(f"could not write a prompt of exactly {tokens} tokens")
    return text


def run_ours(args, model, prompts):
    """One GRPO step of run_ppo's trainer in this process; prints a JSON line of its figures."""
    import paddle
    from bench_grpo import CONFIG, time_phases

    from llm.alignment.ppo.run_ppo import build_trainer

    completions = args.prompts * args.samples
    trainer = build_trainer([
        CONFIG,
        "--actor_model_name_or_path", model,
        "--train_datasets", prompts,
        "--eval_datasets", "",
        "--output_dir", os.path.join(args.work, "out"),
        "--logging_dir", os.path.join(args.work, "vdl"),
        "--use_rm_server", "false", "--use_rule_reward", "true", "--reward_task", "arith",
        "--per_device_prompt_batch_size", str(args.prompts), "--rollout_n", str(args.samples),
        "--max_prompt_len", str(args.prompt_tokens), "--max_dec_len", str(args.new_tokens),
        "--min_dec_len", str(args.new_tokens), "--max_length", str(args.prompt_tokens + args.new_tokens),
        "--per_device_train_batch_size", str(args.micro_batch),
        "--gradient_accumulation_steps", str(completions // args.micro_batch),
        "--kl_loss_coeff", "0.04", "--kl_estimator", "k3",
        "--recompute", "true" if args.recompute else "false",
        "--share_prompt_forward", "true" if args.share_prompt_forward else "false",
        "--max_steps", "1", "--disable_tqdm", "true",
        "--pipeline_parallel_degree", str(args.internal_pipeline),
        *(["--eval_mode", args.eval_mode] if args.internal_pipeline > 1 else []),
        *(["--teacher_model_name_or_path", model_folder(args, args.teacher_layers), "--distill_loss", args.distill_loss]
          if args.teacher_layers else []),
    ])
    trainer.prepare_training()
    batches = trainer.endless_batches("train", trainer.train_dataset, trainer.args.per_device_prompt_batch_size)
    trainer.rollout.start(0, trainer.offload)
    phases, sampling = time_phases(trainer)
    reset_peak_rss()
    started = time.perf_counter()
    try:
        exp, metrics = trainer.advance(batches)
    finally:
        trainer.rollout.close()
    seconds = time.perf_counter() - started
    policy = sum(int(p.numel()) for p in trainer.model.parameters())
    # Frozen weights: the reference's and, distilling, the teacher's.
    frozen = sum(int(p.numel()) for model in (trainer.rollout.worker.reference_model, trainer.teacher_model)
                 if model is not None for p in model.parameters())
    print(json.dumps({
        "rank": paddle.distributed.get_rank(), "weight_move_seconds": metrics.get("weight_move_seconds"),
        "seconds": seconds, "phases": dict(phases), "sampling": sampling["sampling"], "peak_rss_gb": step_peak_rss_gb(),
        "process_peak_rss_gb": peak_rss_gb(),
        "static_gb": 4 * (4 * policy + frozen) / 2**30, "parameters": policy,
        "response_tokens": int(exp.response_mask.sum()), "update_padding_ratio": metrics["update_padding_ratio"],
    }))


def run_ours_process(args, stages):
    """run_ours in a process of its own (its peak RSS its own), or over `stages` pipeline stages under
    paddle.distributed.launch; each rank's figures."""
    own = [os.path.abspath(__file__), "--internal_ours", "--internal_pipeline", str(stages), *sys.argv[1:]]
    if stages == 1:
        command = [sys.executable, *own]
    else:
        log_dir = os.path.join(args.work, f"pp{stages}_log")
        command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(stages), "--log_dir", log_dir, *own]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        logs = "" if stages == 1 else "".join(open(os.path.join(log_dir, f"workerlog.{rank}")).read()[-3000:] for rank in range(stages))
        sys.exit(f"our run failed:\n{result.stderr[-6000:]}{logs}")
    if stages == 1:
        return [json.loads(result.stdout.strip().splitlines()[-1])]
    figures = []
    for rank in range(stages):
        with open(os.path.join(log_dir, f"workerlog.{rank}")) as log:
            figures.append(json.loads([line for line in log if line.startswith('{"rank"')][-1]))
    return figures


def pipeline_step(args, one):
    """The step at --pipeline_parallel_degree stages beside the one process's (`one`)."""
    ranks = run_ours_process(args, args.pipeline_parallel_degree)
    print(f"pp{args.pipeline_parallel_degree}: eval_mode {args.eval_mode}")
    for figures in ranks:
        phases = ", ".join(f"{name} {value:.1f} s" for name, value in figures["phases"].items())
        print(f"pp{args.pipeline_parallel_degree} rank {figures['rank']}: {figures['seconds']:.1f} s for the step ({phases})")
        print(f"pp_rank{figures['rank']}_peak_rss_gb={figures['peak_rss_gb']:.2f}")
    print(f"pp_weight_move_seconds={ranks[0]['weight_move_seconds']:.2f}")
    print(f"pp_seconds_per_step={max(figures['seconds'] for figures in ranks):.1f}")
    print(f"one_process_peak_rss_gb={one['peak_rss_gb']:.2f}")
    print(f"pp_peak_over_one_process={max(figures['peak_rss_gb'] for figures in ranks) / one['peak_rss_gb']:.2f}")


def run_trl(args, model, prompts):
    command = [args.trl_python, os.path.join(BENCHMARKS, "bench_trl_grpo.py"), "--model", model, "--prompts", prompts,
               "--num_prompts", str(args.prompts), "--num_generations", str(args.samples), "--new_tokens", str(args.new_tokens),
               "--micro_batch", str(args.micro_batch), "--steps", "1", "--warmup", "0", "--threads", str(os.cpu_count())]
    if args.recompute:
        command.append("--gradient_checkpointing")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"TRL's run failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    lines = result.stdout.strip().splitlines()
    figures = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)
    return lines, float(figures["seconds_per_step"]), float(figures["peak_rss_gb"])


def step(args, model, prompts):
    print(f"work: {args.prompts} prompts of {args.prompt_tokens} tokens x {args.samples} samples x exactly "
          f"{args.new_tokens} new tokens, micro-batches of {args.micro_batch} rows, recompute {'on' if args.recompute else 'off'}, "
          f"prompts shared {'on' if args.share_prompt_forward else 'off'}")
    ours = run_ours_process(args, stages=1)[0]
    phases = ", ".join(f"{name} {value:.1f} s" for name, value in ours["phases"].items())
    print(f"ours: {ours['seconds']:.1f} s for the step ({phases}; sampling {ours['sampling']:.1f} s of the rollout)")
    print(f"ours: {ours['parameters'] / 1e6:.0f}M parameters, response tokens {ours['response_tokens']}, "
          f"update computes on {ours['update_padding_ratio']:.3f} x the real tokens")
    print(f"ours: peak RSS of the whole process (loading included) {ours['process_peak_rss_gb']:.2f} GB")
    print(f"static_footprint_gb={ours['static_gb']:.2f}")
    print(f"peak_rss_gb={ours['peak_rss_gb']:.2f}")
    print(f"peak_over_static={ours['peak_rss_gb'] / ours['static_gb']:.2f}")
    print(f"ours_seconds_per_step={ours['seconds']:.1f}")
    if args.teacher_layers:
        print(f"teacher_share_of_step={ours['phases']['teacher'] / ours['seconds']:.3f}")
    if args.pipeline_parallel_degree > 1:
        pipeline_step(args, ours)
    if args.trl_python:
        lines, trl_seconds, trl_peak = run_trl(args, model, prompts)
        for line in lines:
            if line.startswith(("model:", "torch ", "checked per step:", "per step:")):
                print(f"trl: {line}")
        print(f"trl_seconds_per_step={trl_seconds:.1f}")
        print(f"trl_peak_rss_gb={trl_peak:.2f}")
        print(f"ours_vs_trl={trl_seconds / ours['seconds']:.2f}")


def read_bandwidth(np, threads=2):
    """Bytes per second that `threads` threads read: 2 GiB, the best of 3 reads by each of numpy's dot and max
    (both release the GIL). Each way fell short of the memory on some CPU: numpy's sum, used before 2026-11-26,
    read 24 GB/s on the AMD EPYC where dot read 29 and a plain AVX2 loop 31; on an Intel Xeon (family 6, model
    207; 2026-11-28) OpenBLAS's dot read 12.7 GB/s where max read 21.5 and a plain AVX-512 loop 22-23. A
    slow reader makes the bandwidth limit look slower than it is."""
    from concurrent.futures import ThreadPoolExecutor

    parts = [np.ones(2**28, dtype=np.float32) for _ in range(threads)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for read in (lambda part: np.dot(part, part), np.max):
            list(pool.map(read, parts))
            for _ in range(3):
                started = time.perf_counter()
                list(pool.map(read, parts))
                best = min(best, time.perf_counter() - started)
    return sum(part.nbytes for part in parts) / best


def matmul_flops(paddle, rows, shapes):
    """FLOP/s of paddle.matmul (MKL) on the products [rows, k] @ [k, n] for each (k, n), best of 3."""
    pairs = [(paddle.randn([rows, k]), paddle.randn([k, n])) for k, n in shapes]
    work = sum(2 * rows * k * n for k, n in shapes)
    times = []
    for _ in range(4):
        started = time.perf_counter()
        for a, b in pairs:
            paddle.matmul(a, b)
        times.append(time.perf_counter() - started)
    return work / min(times[1:])


def decode(args, model, prompts):
    """The fast decode loop and paddlenlp's generate() on --prompts x --samples rows: the prefill, then
    milliseconds per decode step (from the best of two runs of 1 new token and of two of --new_tokens), beside the step's two
    limits: one read of the weights at the memory bandwidth measured, and its arithmetic at the FLOP/s of a
    large product (this CPU's peak as MKL reaches it); and what paddle.matmul takes on the step's shapes."""
    import numpy as np
    import paddle

    from paddle_alignment.cpu_runtime import describe
    from paddle_alignment.models.loading import pretrained_causal_lm, pretrained_tokenizer
    from paddle_alignment.rollout.decode import SamplingConfig, generate_rollouts

    paddle.set_device("cpu")
    print(describe())
    tokenizer, policy = pretrained_tokenizer(model), pretrained_causal_lm(model, dtype="float32")
    items = [json.loads(line) for line in open(prompts)]
    items = [{"prompt": r["src"], "label": r["tgt"], "input_ids": tokenizer(r["src"])["input_ids"]} for r in items]
    rows = len(items) * args.samples

    def run_seconds(new_tokens, use_fast):
        sampling = SamplingConfig(max_dec_len=new_tokens, min_dec_len=new_tokens)
        started = time.perf_counter()
        exp = generate_rollouts(policy, tokenizer, items, args.samples, sampling, use_fast=use_fast, seed=1)
        assert int(exp.response_mask.sum()) == rows * new_tokens
        return time.perf_counter() - started

    def prefill_and_step(use_fast):
        run_seconds(1, use_fast)  # warm-up
        # The best of two runs each: with few new tokens one slow prefill made the step's time negative in CI.
        prefill = min(run_seconds(1, use_fast) for _ in range(2))
        return prefill, (min(run_seconds(args.new_tokens, use_fast) for _ in range(2)) - prefill) / (args.new_tokens - 1)

    config = policy.config
    weights = {id(p): p for p in policy.parameters()}
    weight_bytes = sum(int(p.numel()) * 4 for p in weights.values())
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * (config.hidden_size // config.num_attention_heads)
    layer = [(config.hidden_size, qkv), (config.hidden_size, config.hidden_size),
             (config.hidden_size, 2 * config.intermediate_size), (config.intermediate_size, config.hidden_size)]
    shapes = layer * config.num_hidden_layers + [(config.hidden_size, config.vocab_size)]
    bandwidth, peak = read_bandwidth(np), matmul_flops(paddle, 2048, [(2048, 2048)])
    flops = matmul_flops(paddle, rows, shapes)
    step_flop = sum(2 * rows * k * n for k, n in shapes)
    bandwidth_limit, arithmetic_limit = weight_bytes / bandwidth, step_flop / peak
    fast_prefill, fast = prefill_and_step(True)
    slow_prefill, slow = prefill_and_step(False)
    print(f"{rows} rows, prompts of {args.prompt_tokens} tokens, {args.new_tokens} new tokens each")
    print(f"weights read per decode step: {weight_bytes / 2**30:.2f} GiB; read bandwidth measured (2 threads): "
          f"{bandwidth / 1e9:.1f} GB/s; the step's matrix products: {step_flop / 1e9:.1f} GFLOP; MKL's FLOP/s: "
          f"{peak / 1e9:.0f} GFLOP/s on a large product, {flops / 1e9:.0f} on the step's shapes (paddle.matmul, "
          f"{1000 * step_flop / flops:.0f} ms)")
    print(f"prefill: fast loop {fast_prefill:.1f} s, generate() {slow_prefill:.1f} s")
    print(f"decode step: fast loop {1000 * fast:.0f} ms, generate() {1000 * slow:.0f} ms; bandwidth limit "
          f"{1000 * bandwidth_limit:.0f} ms, arithmetic limit {1000 * arithmetic_limit:.0f} ms")
    print(f"fast_tokens_per_s={rows / fast:.1f}")
    print(f"generate_tokens_per_s={rows / slow:.1f}")
    print(f"fast_over_arithmetic_limit={fast / arithmetic_limit:.2f}")
    print(f"fast_over_bandwidth_limit={fast / bandwidth_limit:.2f}")


def packing(args, model, prompts):
    """The decoder op's decode step on the plain weights and on a session's packed ones (native_packed_products),
    alternating in one process, at each of --rows, one new token after --prompt_tokens cached positions: the
    median of --repeats steps each, and the seconds the packing took."""
    import statistics

    import paddle

    from paddle_alignment.cpu_runtime import describe
    from paddle_alignment.models.loading import pretrained_causal_lm
    from paddle_alignment.models.native_forward import PACKED_MIN_STEPS, NativeDecoder

    paddle.set_device("cpu")
    print(describe())
    plain = NativeDecoder.for_model(pretrained_causal_lm(model, dtype="float32"))
    position, length = args.prompt_tokens, args.prompt_tokens + 1
    for rows in args.rows:
        started = time.perf_counter()
        packed = plain.for_session(rows, PACKED_MIN_STEPS)
        pack_seconds = time.perf_counter() - started
        inputs = (paddle.zeros([rows, 1], dtype="int64"), paddle.full([rows, 1], position, dtype="int64"),
                  paddle.ones([rows, length], dtype="int64"), plain.new_cache(rows, length), plain.rope_tables(length))
        seconds = {"plain": [], "packed": []}
        with paddle.no_grad():
            for _ in range(args.repeats):
                for name, decoder in (("plain", plain), ("packed", packed)):
                    started = time.perf_counter()
                    decoder(*inputs, position, 0, 1)
                    seconds[name].append(time.perf_counter() - started)
        plain_ms, packed_ms = (1000 * statistics.median(seconds[name]) for name in ("plain", "packed"))
        print(f"rows={rows} plain_ms={plain_ms:.0f} packed_ms={packed_ms:.0f} packing_s={pack_seconds:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the model, prompts and outputs (reused)")
    parser.add_argument("--mode", choices=("step", "decode", "packing"), default="step")
    parser.add_argument("--name", default="qwen2.5-0.5b", help="the architecture (llm/tools/build_real_model.py --name)")
    parser.add_argument("--layers", type=int, default=24, help="Qwen2.5-0.5B's 24, or fewer (Qwen3-0.6B has 28)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt_tokens", type=int, default=256)
    parser.add_argument("--new_tokens", type=int, default=512)
    parser.add_argument("--micro_batch", type=int, default=2, help="rows per forward with gradient")
    parser.add_argument("--recompute", action="store_true", help="recompute (TRL: gradient checkpointing)")
    parser.add_argument("--share_prompt_forward", action="store_true", help="our update runs each prompt once for its samples")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32], help="--mode packing's row counts")
    parser.add_argument("--repeats", type=int, default=10, help="--mode packing's steps per variant and row count")
    parser.add_argument("--trl_python", default=None, help="a Python with torch, transformers and trl (see bench_trl_grpo.py)")
    parser.add_argument("--pipeline_parallel_degree", type=int, default=1, help="also run the step over this many pipeline stages")
    parser.add_argument("--eval_mode", choices=("single", "tensor_parallel"), default="single", help="the pipeline run's rollout models")
    parser.add_argument("--teacher_layers", type=int, default=0, help="also distil from a teacher of --name with this many layers")
    parser.add_argument("--distill_loss", default="reverse_kl", help="with --teacher_layers: reverse_kl or gkd")
    parser.add_argument("--internal_ours", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--internal_pipeline", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "step" and (args.prompts * args.samples) % args.micro_batch:
        parser.error(f"--micro_batch {args.micro_batch} must divide the {args.prompts * args.samples} responses")
    os.makedirs(args.work, exist_ok=True)
    from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe

    configure_cpu_runtime()  # before paddle loads
    if args.internal_ours:
        return run_ours(args, *build_world(args))
    if args.mode == "step":
        print(describe())
    model, prompts = build_world(args)
    {"step": step, "decode": decode, "packing": packing}[args.mode](args, model, prompts)


if __name__ == "__main__":
    main()
