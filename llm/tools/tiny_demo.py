"""The tiny end-to-end demo: SFT then GRPO on CPU, with the reward server, in a few minutes.

    python -m llm.tools.tiny_demo        (from the repository root)

Steps: build the tokenizer, a tiny Qwen2 and the `a+b+c=` data under tiny_demo/; SFT it with
config/tiny/sft_argument.json; start the reward server; run GRPO with config/tiny/grpo_argument.json
under `paddle.distributed.launch`; stop the server. The last line printed is
`accuracy_before=<a> accuracy_after=<b>`: greedy accuracy on held-out prompts before and after GRPO.
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

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORK_DIR = "tiny_demo"
SFT_CONFIG = "config/tiny/sft_argument.json"
GRPO_CONFIG = "config/tiny/grpo_argument.json"


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


def read_accuracy(output_dir, split):
    path = os.path.join(REPO_ROOT, output_dir, f"{split}_results.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)["eval_accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc_per_node", type=int, default=1, help="GRPO processes (CPU data parallel with gloo)")
    parser.add_argument("--port", type=int, default=8731, help="port of the reward server")
    args = parser.parse_args()

    started = time.time()
    python = sys.executable
    grpo = read_config(GRPO_CONFIG)
    sft = read_config(SFT_CONFIG)
    os.makedirs(os.path.join(REPO_ROOT, WORK_DIR), exist_ok=True)
    run([python, "-m", "llm.tools.build_tokenizer", "--output_dir", f"{WORK_DIR}/models/tokenizer"])
    run([python, "-m", "llm.tools.build_tiny_model", "--tokenizer_dir", f"{WORK_DIR}/models/tokenizer", "--output_dir", sft["model_name_or_path"]])
    run([python, "-m", "llm.tools.gen_arith", "--output_dir", f"{WORK_DIR}/data"])
    run([python, "llm/run_finetune.py", SFT_CONFIG])

    # paddle.distributed.launch hands its own OMP_NUM_THREADS=1 down to the processes it starts, which leaves
    # MKL one thread each: share the usable cores among them unless the user chose thread counts (on 2 idle
    # cores the GRPO stage took 53 s with one MKL thread, 44 s with two).
    env = dict(os.environ)
    if not {"OMP_NUM_THREADS", "MKL_NUM_THREADS"} & set(os.environ):
        env["MKL_NUM_THREADS"] = str(max(1, usable_cpus() // args.nproc_per_node))
    with reward_server(grpo["reward_task"], args.port, os.path.join(REPO_ROOT, WORK_DIR, "reward_server.log")) as url:
        run(
            [python, "-m", "paddle.distributed.launch", "--nproc_per_node", str(args.nproc_per_node),
             "--log_dir", f"{WORK_DIR}/launch_log", "llm/alignment/ppo/run_ppo.py", GRPO_CONFIG, "--reward_server", url,
             # The SFT model is new: an earlier demo's GRPO checkpoints must not be resumed (they would report
             # that run's accuracy as this one's).
             "--overwrite_output_dir", "true"],
            env=env,
        )

    before = read_accuracy(grpo["output_dir"], "initial_eval")
    after = read_accuracy(grpo["output_dir"], "eval")
    print(f"\nGRPO policy: {grpo['output_dir']}/policy")
    print(f"VisualDL logs: visualdl --logdir {WORK_DIR}/vdl_log  (SFT: {sft['logging_dir']}, GRPO: {grpo['logging_dir']})")
    print(f"wall time: {time.time() - started:.0f}s")
    print(f"accuracy_before={before:.4f} accuracy_after={after:.4f}")


if __name__ == "__main__":
    main()
