"""The tiny end-to-end demos: SFT then GRPO on CPU, in a few minutes.

    python -m llm.tools.tiny_demo            (from the repository root)
    python -m llm.tools.tiny_demo --tools    the tool task
    python -m llm.tools.tiny_demo --dpo      DPO instead of GRPO (--kto: KTO)
    python -m llm.tools.tiny_demo --distill  on-policy distillation of the SFT model from the GRPO policy

The sum task: build the tokenizer, a tiny Qwen2 and the `a+b+c=` data under tiny_demo/; SFT it with
config/tiny/sft_argument.json; start the reward server; run GRPO with config/tiny/grpo_argument.json
under `paddle.distributed.launch`; stop the server. The last line printed is
`accuracy_before=<a> accuracy_after=<b>`: greedy accuracy on held-out prompts before and after GRPO.

Preference alignment (`--dpo`, `--kto`): the same tokenizer, model, data and SFT; then run_dpo.py with
config/tiny/dpo_argument.json on pairs of the right sum against the careless annotator's slip (or run_kto.py
with config/tiny/kto_argument.json on the same replies unpaired). No reward server: the pairs are the signal.
The last line printed is `accuracy_before=<a> accuracy_after=<b>`, greedy accuracy on the held-out prompts
(llm/predict/predictor.py) before and after.

On-policy distillation (`--distill`): the sum task's SFT and GRPO as above, then the SFT model (the student)
learns from the GRPO policy (the teacher) with config/tiny/distill_argument.json: rl_algorithm on_policy_distill,
no reward server or rule, the teacher's log-probs of the student's own samples the only signal. The last line
printed is `accuracy_student_before=<a> accuracy_student_after=<b> accuracy_teacher=<c>`, greedy accuracy on the
held-out prompts (llm/predict/predictor.py).

The tool task (`--tools`): two-digit products with a `calc` tool, which a 1M-parameter model cannot compute
alone. Build the tokenizer with Qwen2.5's tool tags, a tiny Qwen2 and the products' data; SFT on
demonstrations of which 30% call the tool (config/tiny/sft_tool_argument.json); then GRPO twice on the same
budget, with the tool (config/tiny/grpo_tool_argument.json, multi-turn rollouts) and with it disabled.
The last line printed is `tool_call_rate_before=<r> accuracy_before=<a> tool_call_rate_with_tool=<r>
accuracy_with_tool=<a> accuracy_without_tool=<a>`, all greedy on held-out products.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import requests

from paddle_alignment.cpu_runtime import usable_cpus
from paddle_alignment.rewards.arith import arith_reward

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORK_DIR = "tiny_demo"
SFT_CONFIG = "config/tiny/sft_argument.json"
GRPO_CONFIG = "config/tiny/grpo_argument.json"
SFT_TOOL_CONFIG = "config/tiny/sft_tool_argument.json"
GRPO_TOOL_CONFIG = "config/tiny/grpo_tool_argument.json"
DISTILL_CONFIG = "config/tiny/distill_argument.json"
PREFERENCE_CONFIGS = {"dpo": "config/tiny/dpo_argument.json", "kto": "config/tiny/kto_argument.json"}


def run(command, env=None):
    print(f"\n$ {' '.join(command)}", flush=True)
    subprocess.run(command, check=True, cwd=REPO_ROOT, env=env)


def read_config(path):
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        return json.load(f)


@contextmanager
def reward_server(task, port, log_path, timeout=120):
    """Start `reward_server.py` in the background, wait for /health, and stop it on exit."""
    command = [sys.executable, "llm/alignment/ppo/reward_server.py", "--task", task, "--port", str(port)]
    print(f"\n$ {' '.join(command)} &", flush=True)
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server, timeout, log_path)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        print(f"reward server stopped (log: {log_path})", flush=True)


def wait_until_healthy(url, server, timeout, log_path):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the reward server exited with code {server.returncode}; see {log_path}")
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the reward server at {url} did not become healthy in {timeout}s; see {log_path}")


def read_results(output_dir, split):
    path = os.path.join(REPO_ROOT, output_dir, f"{split}_results.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def grpo_env(nproc_per_node):
    """The environment of the GRPO processes. paddle.distributed.launch hands its own OMP_NUM_THREADS=1 down to
    the processes it starts, which leaves MKL one thread each: share the usable cores among them unless the user
    chose thread counts (on 2 idle cores the sum task's GRPO stage took 53 s with one MKL thread, 44 s with two)."""
    env = dict(os.environ)
    if not {"OMP_NUM_THREADS", "MKL_NUM_THREADS"} & set(os.environ):
        env["MKL_NUM_THREADS"] = str(max(1, usable_cpus() // nproc_per_node))
    return env


def launch_run_ppo(config, nproc_per_node, options=()):
    """run_ppo.py with `config` under paddle.distributed.launch, then `options`. The SFT model is new: an earlier
    demo's GRPO checkpoints must not be resumed (they would report that run's accuracy as this one's)."""
    run(
        [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc_per_node),
         "--log_dir", f"{WORK_DIR}/launch_log", "llm/alignment/ppo/run_ppo.py", config, *options,
         "--overwrite_output_dir", "true"],
        env=grpo_env(nproc_per_node),
    )


def sft_sum_model():
    """The sum task's tokenizer, tiny Qwen2 and data under tiny_demo/, and the model fine-tuned on the
    demonstrations (config/tiny/sft_argument.json)."""
    python = sys.executable
    sft = read_config(SFT_CONFIG)
    run([python, "-m", "llm.tools.build_tokenizer", "--output_dir", f"{WORK_DIR}/models/tokenizer"])
    run([python, "-m", "llm.tools.build_tiny_model", "--tokenizer_dir", f"{WORK_DIR}/models/tokenizer", "--output_dir", sft["model_name_or_path"]])
    run([python, "-m", "llm.tools.gen_arith", "--output_dir", f"{WORK_DIR}/data"])
    run([python, "llm/run_finetune.py", SFT_CONFIG])
    return sft


def grpo_sum_policy(args):
    """The sum task's GRPO run (config/tiny/grpo_argument.json) with its reward server; returns its config."""
    grpo = read_config(GRPO_CONFIG)
    with reward_server(grpo["reward_task"], args.port, os.path.join(REPO_ROOT, WORK_DIR, "reward_server.log")) as url:
        launch_run_ppo(GRPO_CONFIG, args.nproc_per_node, ["--reward_server", url])
    return grpo


def sum_demo(args):
    sft = sft_sum_model()
    grpo = grpo_sum_policy(args)
    before = read_results(grpo["output_dir"], "initial_eval")["eval_accuracy"]
    after = read_results(grpo["output_dir"], "eval")["eval_accuracy"]
    print(f"\nGRPO policy: {grpo['output_dir']}/policy")
    print(f"VisualDL logs: visualdl --logdir {WORK_DIR}/vdl_log  (SFT: {sft['logging_dir']}, GRPO: {grpo['logging_dir']})")
    return f"accuracy_before={before:.4f} accuracy_after={after:.4f}"


def greedy_accuracy(model_dir, name):
    """Greedy accuracy of the model at `model_dir` on the held-out sum prompts, decoded by the predictor."""
    prompts = f"{WORK_DIR}/data/rl/eval.jsonl"
    output = f"{WORK_DIR}/predictions/{name}.jsonl"
    run([sys.executable, "llm/predict/predictor.py", "--model_name_or_path", model_dir, "--data_file", prompts,
         "--output_file", output, "--batch_size", "200", "--max_length", "8"])
    with open(os.path.join(REPO_ROOT, output), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return sum(arith_reward(row["src"], row["tgt"], row["output"]) for row in rows) / len(rows)


def preference_demo(kind):
    """SFT, then DPO (`kind` "dpo") or KTO ("kto") on the arith world's preference data."""
    sft = sft_sum_model()
    config = read_config(PREFERENCE_CONFIGS[kind])
    before = greedy_accuracy(sft["output_dir"], "sft")
    run([sys.executable, f"llm/alignment/{kind}/run_{kind}.py", PREFERENCE_CONFIGS[kind]])
    after = greedy_accuracy(config["output_dir"], kind)
    print(f"\n{kind.upper()} policy: {config['output_dir']}")
    print(f"VisualDL logs: visualdl --logdir {WORK_DIR}/vdl_log  (SFT: {sft['logging_dir']}, {kind.upper()}: {config['logging_dir']})")
    return f"accuracy_before={before:.4f} accuracy_after={after:.4f}"


def distill_demo(args):
    """SFT and GRPO on the sum task, then on-policy distillation of the SFT model from the GRPO policy."""
    sft = sft_sum_model()
    grpo_sum_policy(args)
    config = read_config(DISTILL_CONFIG)
    before = greedy_accuracy(sft["output_dir"], "sft")
    teacher = greedy_accuracy(config["teacher_model_name_or_path"], "teacher")
    launch_run_ppo(DISTILL_CONFIG, args.nproc_per_node)
    after = greedy_accuracy(f"{config['output_dir']}/policy", "distilled")
    print(f"\ndistilled student: {config['output_dir']}/policy (teacher: {config['teacher_model_name_or_path']})")
    print(f"VisualDL logs: visualdl --logdir {WORK_DIR}/vdl_log  (distillation: {config['logging_dir']})")
    return f"accuracy_student_before={before:.4f} accuracy_student_after={after:.4f} accuracy_teacher={teacher:.4f}"


def tool_demo(args):
    python = sys.executable
    grpo = read_config(GRPO_TOOL_CONFIG)
    sft = read_config(SFT_TOOL_CONFIG)
    tokenizer_dir = f"{WORK_DIR}/models/tokenizer-tools"
    run([python, "-m", "llm.tools.build_tokenizer", "--output_dir", tokenizer_dir, "--tool_tags"])
    run([python, "-m", "llm.tools.build_tiny_model", "--tokenizer_dir", tokenizer_dir, "--output_dir", sft["model_name_or_path"]])
    run([python, "-m", "llm.tools.gen_calc", "--output_dir", os.path.dirname(sft["dataset_name_or_path"])])
    run([python, "llm/run_finetune.py", SFT_TOOL_CONFIG])
    launch_run_ppo(GRPO_TOOL_CONFIG, args.nproc_per_node)
    without = {"output_dir": grpo["output_dir"] + "-disabled", "logging_dir": grpo["logging_dir"] + "-disabled"}
    launch_run_ppo(GRPO_TOOL_CONFIG, args.nproc_per_node, ["--tools", "", *[f"--{k}={v}" for k, v in without.items()]])
    before = read_results(grpo["output_dir"], "initial_eval")
    with_tool = read_results(grpo["output_dir"], "eval")
    without_tool = read_results(without["output_dir"], "eval")
    print(f"\nGRPO policies: {grpo['output_dir']}/policy (with the tool), {without['output_dir']}/policy (without)")
    print(f"VisualDL logs: visualdl --logdir {WORK_DIR}/vdl_log  (SFT: {sft['logging_dir']}, GRPO: {grpo['logging_dir']}, "
          f"{without['logging_dir']})")
    return (
        f"tool_call_rate_before={before['eval_tool_call_rate']:.4f} accuracy_before={before['eval_accuracy']:.4f} "
        f"tool_call_rate_with_tool={with_tool['eval_tool_call_rate']:.4f} accuracy_with_tool={with_tool['eval_accuracy']:.4f} "
        f"accuracy_without_tool={without_tool['eval_accuracy']:.4f}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    task = parser.add_mutually_exclusive_group()
    task.add_argument("--tools", action="store_true", help="the tool task (products with a calc tool) instead of the sum task")
    task.add_argument("--dpo", action="store_true", help="DPO on the sum task's preference pairs instead of GRPO")
    task.add_argument("--kto", action="store_true", help="KTO on the sum task's replies marked right or wrong instead of GRPO")
    task.add_argument("--distill", action="store_true", help="GRPO, then on-policy distillation of the SFT model from the GRPO policy")
    parser.add_argument("--nproc_per_node", type=int, default=1, help="GRPO processes (CPU data parallel with gloo)")
    parser.add_argument("--port", type=int, default=8731, help="port of the sum task's reward server")
    args = parser.parse_args()

    started = time.time()
    os.makedirs(os.path.join(REPO_ROOT, WORK_DIR), exist_ok=True)
    if args.tools:
        summary = tool_demo(args)
    elif args.distill:
        summary = distill_demo(args)
    elif args.dpo or args.kto:
        summary = preference_demo("dpo" if args.dpo else "kto")
    else:
        summary = sum_demo(args)
    print(f"wall time: {time.time() - started:.0f}s")
    print(summary)


if __name__ == "__main__":
    main()
