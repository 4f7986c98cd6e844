"""TRL's GRPOTrainer on the work of benchmarks/bench_grpo.py: completions per second after warm-up (issue 13).

    /work/trl_venv/bin/python benchmarks/bench_trl_grpo.py [--tokenizer DIR] [--model_config DIR] [--steps 20] [--warmup 5] [--threads 2]

The reference figure of issue 13 ("TRL GRPOTrainer ... completions/s") comes from this script; compare it
with, run back to back on the same machine:

    python benchmarks/bench_grpo.py --random_model -- --max_dec_len 8 --min_dec_len 8 --kl_loss_coeff 0.04 --kl_estimator k3

The work of one step is the same: a random tiny Qwen2 of the demo's shape (the config.json of a model
folder made by llm/tools/build_tiny_model.py at its defaults, read by transformers: 4 layers, hidden 128,
intermediate 512, 4 heads, 2 kv heads, tied embeddings, the project's byte-level tokenizer; about 1M
parameters, float32; the weights are torch's random ones), 8 prompts of the demo's arithmetic task x 8 samples = 64 completions of exactly 8
new tokens (EOS suppressed by min_new_tokens), the rule reward (the `arith` rule, in-process), group
advantages, k3 KL to a frozen reference model with beta 0.04, and one optimizer step (AdamW) over the 64
completions: generation_batch_size 64 = per_device_train_batch_size 64 x steps_per_generation 1,
gradient_accumulation_steps 1, num_iterations 1. The script checks each timed step for exactly that
(one rollout of 64 completions of 8 tokens, 64 rows through the reference model, one forward with
gradient, one optimizer step) and stops if TRL did more or less. No logging, saving or evaluation; bf16
and gradient checkpointing off (TRL's defaults are on; the project trains in float32 without
recompute); torch threads as given (default 2).

It needs torch, transformers and TRL, which live in a virtualenv of their own outside the repository
(the system Python keeps Paddle). What worked on the project's machine (Python 3.11):

    python -m venv /work/trl_venv
    /work/trl_venv/bin/pip install "torch==2.13.0+cpu"     # CPU-only wheel (no CUDA libraries)
    /work/trl_venv/bin/pip install trl==1.16.0 transformers==5.23.0 datasets==5.2.0 accelerate==1.15.0

The `+cpu` wheel is PyTorch's CPU-only build (PyTorch's own CPU wheel index serves it; the project's
machine has it in its local wheel folder). Plain `pip install torch` from PyPI also works but pulls
several GB of CUDA libraries.

The tokenizer and the model's shape are the project's: the folders written by (with the system Python,
which has Paddle)

    python -m llm.tools.build_tokenizer --output_dir tiny_demo/models/tokenizer
    python -m llm.tools.build_tiny_model --tokenizer_dir tiny_demo/models/tokenizer --output_dir tiny_demo/models/tiny-qwen2

(both also made by `python -m llm.tools.tiny_demo`); they are the defaults of --tokenizer and --model_config. The prompts
are the demo's RL training prompts, generated here by llm/tools/gen_arith.py (standard library only) as
bench_grpo.py does.

Prints the versions, torch's thread count, the seconds per step split into rollout (sampling + rule
reward), reference (the reference model's log-prob pass) and update+other (the loss's forward, backward,
optimizer step, and TRL's and the Trainer's bookkeeping), then completions_per_s=<n> as the last line.

Compare on an idle machine: with 2 torch threads the step took 3-5 s instead of 0.2 s while other
processes kept the 2 cores busy (1 thread: 0.34-0.44 s); run the two benchmarks alternately.

Real-size work (benchmarks/bench_real_size.py runs this script so): `--model DIR` a Hugging Face folder used
as it is (a Qwen2.5-0.5B-shaped model from llm/tools/build_real_model.py), `--prompts FILE` a src/tgt jsonl
of the prompts, `--num_prompts`, `--num_generations` and `--new_tokens` the work of one step,
`--micro_batch` rows per forward with gradient (gradient accumulation over the rest, one optimizer step per
generation, as TRL's steps_per_generation does), `--gradient_checkpointing`. The last lines also give the
peak RSS since training began (the kernel's high-water mark reset then) and the whole process's.
"""

import argparse
import os
import re
import resource
import sys
import tempfile
import time
from collections import defaultdict

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import load_dataset  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from llm.tools.gen_arith import generate  # noqa: E402  (standard library only, no paddle)

DEFAULT_TOKENIZER = os.path.join(REPO_ROOT, "tiny_demo", "models", "tokenizer")
DEFAULT_MODEL_CONFIG = os.path.join(REPO_ROOT, "tiny_demo", "models", "tiny-qwen2")
_INTEGER = re.compile(r"-?\d{1,6}")


class Counters:
    """What the timed steps did: filled by the reward function, hooks and the callback."""

    def __init__(self):
        self.new_tokens = None
        self.counting = False
        self.counts = defaultdict(int)
        self.step_ends = []

    def add(self, name, n=1):
        if self.counting:
            self.counts[name] += n


COUNTERS = Counters()


def arith_reward(completions, tgt, completion_ids, **kwargs):
    """The project's `arith` rule (llm/paddle_alignment/rewards/arith.py): 1.0 when the completion is exactly the
    expected integer (surrounding spaces allowed), else 0.0."""
    COUNTERS.add("completions", len(completions))
    COUNTERS.add("completions_of_other_lengths", sum(len(ids) != COUNTERS.new_tokens for ids in completion_ids))
    rewards = []
    for completion, target in zip(completions, tgt):
        answer = completion.strip()
        rewards.append(1.0 if _INTEGER.fullmatch(answer) and int(answer) == int(target) else 0.0)
    return rewards


class StepTimer(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        COUNTERS.step_ends.append(time.perf_counter())  # the start of the first step
        with open("/proc/self/clear_refs", "w") as handle:  # the steps' peak RSS, not the loading's (Linux)
            handle.write("5")

    def on_step_end(self, args, state, control, **kwargs):
        COUNTERS.step_ends.append(time.perf_counter())

    def on_optimizer_step(self, args, state, control, **kwargs):
        COUNTERS.add("optimizer_steps")


def time_phases(trainer, seconds):
    """Wrap this trainer's phase methods to add their wall time (while counting) to `seconds`."""

    def timed(name, method, only_no_grad=False):
        def wrapper(*args, **kwargs):
            if not COUNTERS.counting or (only_no_grad and torch.is_grad_enabled()):
                return method(*args, **kwargs)
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - started
        return wrapper

    trainer._generate = timed("rollout", trainer._generate)
    trainer._calculate_rewards = timed("rollout", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed(
        "reference", trainer._get_per_token_logps_and_entropies, only_no_grad=True)


def build_model(config_dir, tokenizer, output_dir, seed=0):
    """A random Qwen2 of the shape in `config_dir`'s config.json (the project's tiny model), saved so that TRL
    loads the policy and the reference model from one folder (the same initial weights)."""
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config.from_pretrained(config_dir)).float()
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return sum(p.numel() for p in model.parameters())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="the project's byte-level tokenizer folder")
    parser.add_argument("--model_config", default=DEFAULT_MODEL_CONFIG, help="a model folder whose config.json gives the shape")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--model", default=None, help="a Hugging Face model folder to train as it is (default: a random model of --model_config's shape)")
    parser.add_argument("--prompts", default=None, help="src/tgt jsonl of the prompts (default: the demo's arithmetic prompts)")
    parser.add_argument("--num_prompts", type=int, default=8)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=8, help="exactly this many new tokens per completion")
    parser.add_argument("--micro_batch", type=int, default=None, help="rows per forward with gradient (default: all)")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    args = parser.parse_args()
    if args.model is not None:
        return run(args, args.model, args.prompts)
    if not os.path.isfile(os.path.join(args.tokenizer, "vocab.json")):
        sys.exit(f"no tokenizer in {args.tokenizer}: make it with the system Python (Paddle's) from the repository "
                 f"root: python -m llm.tools.build_tokenizer --output_dir {args.tokenizer}")
    if not os.path.isfile(os.path.join(args.model_config, "config.json")):
        sys.exit(f"no config.json in {args.model_config}: make the tiny model with the system Python (Paddle's): python -m "
                 f"llm.tools.build_tiny_model --tokenizer_dir {args.tokenizer} --output_dir {args.model_config}")

    work = tempfile.mkdtemp(prefix="bench_trl_grpo_")
    model_dir = os.path.join(work, "model")
    build_model(args.model_config, AutoTokenizer.from_pretrained(args.tokenizer), model_dir)
    run(args, model_dir, args.prompts, work)


def run(args, model_dir, prompts, work=None):
    """TRL's GRPO steps on the model folder `model_dir` and the src/tgt prompts (default: the demo's)."""
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    work = work or tempfile.mkdtemp(prefix="bench_trl_grpo_")
    if prompts is None:
        generate(os.path.join(work, "data"), num_sft=0)
        prompts = os.path.join(work, "data", "rl", "train.jsonl")
    dataset = load_dataset("json", data_files=prompts, split="train")
    dataset = dataset.rename_column("src", "prompt")  # used as written, as the project does (no chat template)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    completions_per_step = args.num_prompts * args.num_generations
    micro_batch = args.micro_batch or completions_per_step
    if completions_per_step % micro_batch:
        sys.exit(f"--micro_batch {micro_batch} must divide the {completions_per_step} completions of a step")
    accumulate = completions_per_step // micro_batch
    COUNTERS.new_tokens = args.new_tokens

    config = GRPOConfig(
        output_dir=os.path.join(work, "out"),
        use_cpu=True,
        bf16=False,  # TRL's default is True
        fp16=False,
        # TRL's default is True (a second forward in the backward); the project's recompute is off by default
        gradient_checkpointing=args.gradient_checkpointing,
        seed=42,
        max_steps=args.warmup + args.steps,
        # one step = one rollout of num_prompts x num_generations completions and one optimizer step over them
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulate,
        steps_per_generation=accumulate,
        num_generations=args.num_generations,
        num_iterations=1,
        max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        # the loss of config/tiny/grpo_argument.json: token-mean, clip 0.2 / 0.28, group-normalised advantages
        beta=0.04,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=2e-4,
        lr_scheduler_type="cosine",
        warmup_steps=0.02,  # a ratio of max_steps
        weight_decay=0.0,
        max_grad_norm=1.0,
        # no logging, saving or evaluation overhead
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    assert config.generation_batch_size == completions_per_step
    trainer = GRPOTrainer(model=model_dir, reward_funcs=arith_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()])
    assert trainer.ref_model is not None and trainer.beta == 0.04

    def count_rows(name):
        def hook(module, inputs, kwargs, output):
            ids = kwargs.get("input_ids", inputs[0] if inputs else None)
            COUNTERS.add(name, int(ids.shape[0]))
        return hook

    def count_policy_forwards(module, inputs, kwargs, output):
        COUNTERS.add("policy_forwards_with_grad" if torch.is_grad_enabled() else "policy_forwards_no_grad")

    trainer.ref_model.register_forward_hook(count_rows("reference_rows"), with_kwargs=True)
    trainer.model.register_forward_hook(count_policy_forwards, with_kwargs=True)
    seconds = defaultdict(float)
    time_phases(trainer, seconds)

    class StartCounting(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):
            COUNTERS.counting = state.global_step >= args.warmup and state.global_step < args.warmup + args.steps

    trainer.add_callback(StartCounting())
    COUNTERS.counting = args.warmup == 0
    trainer.train()

    ends = COUNTERS.step_ends[args.warmup :]
    if len(ends) != args.steps + 1:
        sys.exit(f"expected {args.warmup + args.steps} steps, saw {len(COUNTERS.step_ends) - 1}")
    elapsed = ends[-1] - ends[0]
    counts = COUNTERS.counts
    expected = {"completions": completions_per_step * args.steps, "completions_of_other_lengths": 0,
                "reference_rows": completions_per_step * args.steps, "optimizer_steps": args.steps,
                "policy_forwards_with_grad": accumulate * args.steps}
    observed = {name: counts.get(name, 0) for name in expected}
    if observed != expected:
        sys.exit(f"TRL did other work than one step of {completions_per_step} completions per step: expected {expected}, saw {observed}")
    completions = counts["completions"]
    seconds["update+other"] = elapsed - seconds["rollout"] - seconds["reference"]

    n_params = sum(p.numel() for p in trainer.model.parameters())
    print(f"model: {model_dir} ({n_params} parameters, {next(trainer.model.parameters()).dtype})")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"torch threads {torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    print(f"checked per step: 1 rollout of {completions // args.steps} completions x {args.new_tokens} tokens, "
          f"{counts['reference_rows'] // args.steps} reference rows, {counts['optimizer_steps'] // args.steps} optimizer step, policy forwards "
          f"{counts['policy_forwards_with_grad'] // args.steps} with gradient + "
          f"{counts['policy_forwards_no_grad'] / args.steps:g} without (the rollout's prefill and decode steps)")
    print(f"{args.steps} steps of {completions // args.steps} completions in {elapsed:.2f}s ({elapsed / args.steps:.3f} s/step)")
    split = ", ".join(f"{name} {1000 * value / args.steps:.0f} ms" for name, value in seconds.items())
    print(f"per step: {split}")
    with open("/proc/self/status") as handle:
        high_water = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:"))
    print(f"peak_rss_gb={high_water / 2**20:.2f}")  # since training began
    print(f"process_peak_rss_gb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}")
    print(f"seconds_per_step={elapsed / args.steps:.1f}")
    print(f"completions_per_s={completions / elapsed:.1f}")


if __name__ == "__main__":
    main()
