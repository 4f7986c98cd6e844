"""Shared test helpers: a reward server on a loopback port, the tiny world on disk, the tiny GRPO run, config
parsing and NumPy references that test files in several folders use."""

import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
from paddlenlp.transformers import AutoModelForCausalLM
from werkzeug.serving import make_server

from llm import run_finetune
from llm.alignment.ppo import run_ppo
from llm.alignment.ppo.reward_server import create_app, create_wsgi_server
from llm.alignment.rm import run_reward
from llm.tools import gen_kk
from llm.tools.build_real_model import build_real_model
from llm.tools.build_tiny_model import build_tiny_model
from llm.tools.build_tokenizer import build_tokenizer
from llm.tools.gen_arith import generate
from paddle_alignment.config.arguments import parse_arguments
from paddle_alignment.rewards import get_reward_task


@contextmanager
def paddlenlp_messages():
    """Messages paddlenlp's logger (which does not propagate to the root logger) emits meanwhile."""
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("PaddleNLP").addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger("PaddleNLP").removeHandler(handler)


def required(what, reason):
    """Skip on a developer machine without `what`; in CI (CI=true) it is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is required in CI: {reason}")
    pytest.skip(reason)


def built_paddlenlp_ops(names=()):
    """The built `paddlenlp_ops` module, holding every op in `names` (`required` otherwise)."""
    try:
        import paddlenlp_ops
    except ImportError:
        required("paddlenlp_ops", "paddlenlp_ops is not built: python csrc/setup_cpu.py install")
    missing = [name for name in names if not hasattr(paddlenlp_ops, name)]
    if missing:
        required("the ops", f"the installed paddlenlp_ops lacks {missing}: python csrc/setup_cpu.py install")
    return paddlenlp_ops


def running_reward_server(task, **app_options):
    """Serve the reward app on 127.0.0.1 (a free port) in a thread; yields its URL."""
    return serving(create_app(task, **app_options))


@contextmanager
def serving(app):
    """Serve the WSGI `app` on 127.0.0.1 (a free port) in a thread; yields its URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


@contextmanager
def serving_in_production(app, **server_options):
    """Serve the WSGI `app` as reward_server.py does (waitress, `create_wsgi_server` options) on 127.0.0.1
    (a free port) in a thread; yields its URL."""
    server = create_wsgi_server(app, "127.0.0.1", 0, **server_options)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        server.close()
        server.task_dispatcher.shutdown()


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SFT_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "sft_argument.json")


def build_tiny_world(root, hidden_size=64, num_layers=2, sft_steps=200, sft_learning_rate=5e-3, num_eval=64, num_sft=4096):
    """Tokenizer, a tiny Qwen2 (2 layers by default) briefly fine-tuned by run_finetune on the arith
    demonstrations, and the arith data, under `root`; returns the paths. The SFT makes rewards non-zero
    from the start. With DEMO_WORLD's settings it is the tiny demo's world, step for step."""
    tokenizer_dir = os.path.join(root, "tokenizer")
    random_dir = os.path.join(root, "random_model")
    sft_dir = os.path.join(root, "sft_model")
    build_tokenizer(tokenizer_dir)
    build_tiny_model(tokenizer_dir, random_dir, hidden_size=hidden_size, num_layers=num_layers, num_heads=4, num_kv_heads=2)
    generate(os.path.join(root, "data"), num_eval=num_eval, num_sft=num_sft)
    sft_overrides = {
        "model_name_or_path": random_dir,
        "dataset_name_or_path": os.path.join(root, "data", "sft"),
        "output_dir": sft_dir,
        "logging_dir": os.path.join(root, "sft_vdl"),
        "max_steps": sft_steps,
        "per_device_train_batch_size": 64,
        "learning_rate": sft_learning_rate,
        "logging_steps": 20,
    }
    run_finetune.main([SFT_CONFIG] + [t for k, v in sft_overrides.items() for t in (f"--{k}", str(v))])
    return {
        "random_model": random_dir,
        "model": sft_dir,
        "train": os.path.join(root, "data", "rl", "train.jsonl"),
        "eval": os.path.join(root, "data", "rl", "eval.jsonl"),
        "pref_train": os.path.join(root, "data", "pref", "train.jsonl"),
        "pref_eval": os.path.join(root, "data", "pref", "eval.jsonl"),
        "dpo_train": os.path.join(root, "data", "dpo", "train.jsonl"),
        "dpo_eval": os.path.join(root, "data", "dpo", "dev.jsonl"),
        "kto_train": os.path.join(root, "data", "kto", "train.jsonl"),
        "kto_eval": os.path.join(root, "data", "kto", "dev.jsonl"),
        "sft_train": os.path.join(root, "data", "sft", "train.json"),
        "sft_logs": os.path.join(root, "sft_vdl"),
    }


def build_real_world(root):
    """Qwen2.5-0.5B's architecture cut to 2 layers (vocabulary 151,936, 166M parameters, random bfloat16
    weights) written in Hugging Face's layout by llm/tools/build_real_model.py; knights-and-knaves prompts
    of about 670 tokens; the arith SFT and preference data. Returns the paths."""
    model = os.path.join(root, "qwen2.5-0.5b-2layers")
    build_real_model("qwen2.5-0.5b", model, num_layers=2)
    kk = os.path.join(root, "kk")
    gen_kk.main(["--num_samples", "8", "--output", os.path.join(kk, "train.jsonl"), "--test_size", "4", "--test_output", os.path.join(kk, "test.jsonl")])
    generate(os.path.join(root, "arith"), num_eval=8, num_sft=64)
    return {
        "model": model,
        "train": os.path.join(kk, "train.jsonl"),
        "eval": os.path.join(kk, "test.jsonl"),
        "sft_train": os.path.join(root, "arith", "sft", "train.json"),
        "pref_train": os.path.join(root, "arith", "pref", "train.jsonl"),
        "pref_eval": os.path.join(root, "arith", "pref", "eval.jsonl"),
        "dpo_train": os.path.join(root, "arith", "dpo", "train.jsonl"),
    }


def transformers_python():
    """A Python with transformers and torch for the comparisons with them: this one, or $TRANSFORMERS_PYTHON; else None."""
    python = os.environ.get("TRANSFORMERS_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import transformers, torch"], capture_output=True)
    return python if probe.returncode == 0 else None


# Real-length runs on the real-vocabulary world, kept short: ~670-token prompts, 8 new tokens, one
# optimizer step per RL step.
REAL_RUN = {
    "max_prompt_len": 768, "max_dec_len": 8, "max_length": 776, "rollout_n": 2, "per_device_prompt_batch_size": 2,
    "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "logging_steps": 1, "warmup_ratio": 0.0,
}


# The tiny demo's model, data and SFT (llm/tools/tiny_demo.py with config/tiny/sft_argument.json).
DEMO_WORLD = {"hidden_size": 128, "num_layers": 4, "sft_steps": 400, "sft_learning_rate": 3e-3, "num_eval": 200, "num_sft": 20000}

RM_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "rm_argument.json")


def train_reward_model(world, output_dir, processes=1, **changes):
    """run_reward on the world's preference pairs with config/tiny/rm_argument.json (its 300 steps unless
    `changes` say otherwise), in this process or launched over `processes` (worker logs in output_dir/log);
    returns the final eval metrics."""
    values = {
        "model_name_or_path": world["model"],
        "train_datasets": world["pref_train"],
        "eval_datasets": world["pref_eval"],
        "output_dir": output_dir,
        "logging_dir": os.path.join(output_dir, "vdl"),
        "eval_steps": 1000,
        "logging_steps": 20,
        **changes,
    }
    argv = [token for key, value in values.items() for token in (f"--{key}", str(value))]
    if processes == 1:
        run_reward.main([RM_CONFIG, *argv])
    else:
        launch_two_processes(RM_CONFIG, argv, pathlib.Path(output_dir) / "log", script=RUN_REWARD, processes=processes)
    with open(os.path.join(output_dir, "eval_results.json")) as f:
        return json.load(f)


def preference_argv(world, output_dir, kind, **changes):
    """run_dpo's (`kind` "dpo") or run_kto's ("kto") command line on the world's data with config/tiny/KIND_argument.json:
    3 steps of 16, a log every step, evaluation at the end."""
    values = {
        "model_name_or_path": world["model"], "train_dataset_path": world[f"{kind}_train"], "dev_dataset_path": world[f"{kind}_eval"],
        "output_dir": str(output_dir), "logging_dir": os.path.join(str(output_dir), "vdl"), "max_steps": 3,
        "per_device_train_batch_size": 16, "per_device_eval_batch_size": 64, "logging_steps": 1, "eval_steps": 1000,
        **changes,
    }
    config = os.path.join(REPO_ROOT, "config", "tiny", f"{kind}_argument.json")
    return [config] + [token for key, value in values.items() for token in (f"--{key}", str(value))]


def train_log(output_dir, name):
    """The values of a training metric of a run (one a step with logging_steps 1), from its VisualDL logs."""
    return logged(os.path.join(str(output_dir), "vdl"), f"train/{name}")


RUN_PPO = os.path.join(REPO_ROOT, "llm", "alignment", "ppo", "run_ppo.py")
RUN_REWARD = os.path.join(REPO_ROOT, "llm", "alignment", "rm", "run_reward.py")
RUN_FINETUNE = os.path.join(REPO_ROOT, "llm", "run_finetune.py")


def launch_two_processes(config, argv, log_dir, script=RUN_PPO, processes=2):
    """`script` (run_ppo.py) `config` `argv` under `paddle.distributed.launch --nproc_per_node 2` (or
    `processes`); asserts it exits 0 (showing the tails of its logs if not) and returns the ranks' worker logs."""
    returncode, output, logs = launch_two(config, argv, log_dir, script, processes)
    assert returncode == 0, output[-3000:] + "".join(log[-3000:] for log in logs.values())
    return logs


def launch_two(config, argv, log_dir, script=RUN_PPO, processes=2):
    """The launch of launch_two_processes, whatever its exit: (exit code, the launcher's output, the worker logs)."""
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(processes), "--log_dir",
        str(log_dir), script, config, *argv,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    logs = {rank: (log_dir / f"workerlog.{rank}").read_text(errors="replace") for rank in range(processes)}
    return result.returncode, result.stdout + result.stderr, logs


def small_run_argv(world, output_dir, **changes):
    """Command-line overrides pointing a tiny config at the test world, small and fast (a None value
    leaves the config's own)."""
    values = {
        "actor_model_name_or_path": world["model"],
        "train_datasets": world["train"],
        "eval_datasets": world["eval"],
        "output_dir": output_dir,
        "logging_dir": os.path.join(output_dir, "vdl"),
        "rollout_n": 4,
        "per_device_prompt_batch_size": 4,
        "per_device_train_batch_size": 8,
        "max_steps": 3,
        "logging_steps": 1,
        "warmup_ratio": 0.0,
        **changes,
    }
    return [token for key, value in values.items() if value is not None for token in (f"--{key}", str(value))]


def run_probe(script, output, argv, log_dir, processes):
    """A probe script of tests/probes (`script OUTPUT argv...`) in one process, or over `processes` under
    `paddle.distributed.launch`; returns the JSON its rank 0 wrote to `output`."""
    if processes == 1:
        result = subprocess.run(
            [sys.executable, script, str(output), *argv], cwd=REPO_ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
            capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        launch_two_processes(str(output), list(argv), log_dir, script=script, processes=processes)
    return json.loads(output.read_text())


# ---- from test_grpo_e2e.py, shared with other test files ----------------------------------------


TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")


FIRST_STEP_PROBE = os.path.join(REPO_ROOT, "tests", "probes", "grpo_first_step.py")


def first_step(world, tmp_path, run, processes, data_ranks=None, **changes):
    """The first GRPO step (or `max_steps`) of the probe tests/probes/grpo_first_step.py on 8 prompts in all: in
    one process, or launched over `processes`, the prompts split over the `data_ranks` (default: all); returns
    rank 0's metrics (and weight digest). The final policy goes to tmp_path/<run>/policy, worker logs to
    tmp_path/<run>_log."""
    prompts = 8 // (data_ranks or processes)
    argv = small_run_argv(
        world, str(tmp_path / run), per_device_prompt_batch_size=prompts, per_device_train_batch_size=4 * prompts,
        use_rm_server="false", use_rule_reward="true", loss_agg_mode="token-mean", **{"max_steps": 1, **changes},
    )
    return run_probe(FIRST_STEP_PROBE, tmp_path / f"{run}.json", [TINY_CONFIG, *argv], tmp_path / f"{run}_log", processes)


def overrides(world, output_dir, **changes):
    """The tiny GRPO config on the test world with the in-process rule reward, small and fast."""
    defaults = {
        "use_rm_server": False, "use_rule_reward": True, "per_device_eval_batch_size": 16, "sample_log_interval": 1,
        "eval_steps": 2, "save_steps": 2, "learning_rate": 1e-3, "kl_loss_coeff": 0.01,
    }
    return small_run_argv(world, output_dir, **{**defaults, **changes})


def logged(log_dir, tag):
    """The values of the scalar `tag` in the VisualDL logs of `log_dir`, in the order written."""
    from visualdl import LogReader

    values = []
    for name in sorted(os.listdir(log_dir)):
        with LogReader(file_path=os.path.join(log_dir, name)) as reader:
            if tag in reader.get_tags().get("scalar", []):
                values += [record.value for record in reader.get_data("scalar", tag)]
    return values


def run_grpo(world, output_dir, **changes):
    run_ppo.main([TINY_CONFIG, *overrides(world, str(output_dir), **changes)])


FROZEN_RUN = os.path.join(REPO_ROOT, "tests", "probes", "frozen_run.py")


def run_grpo_process(world, output_dir, freeze=None, **changes):
    """run_grpo as a process of its own (as a user's run is: a run inside the test process computes on other
    threads, so its last bits differ), or tests/probes/frozen_run.py with `freeze` ("what:N"); the finished
    process."""
    script = [FROZEN_RUN, freeze] if freeze else [RUN_PPO]
    argv = [sys.executable, *script, TINY_CONFIG, *overrides(world, str(output_dir), **changes)]
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def assert_frozen_run_resumes_as_uninterrupted(world, tmp_path, freeze, message, exit_code=None, frozen_changes=None, **changes):
    """A run frozen by `freeze` (frozen_run.py's "what:N", or None with `frozen_changes`, e.g. a hung reward
    server's URL) ends with `exit_code` (default the watchdog's) and `message` (a regex) in its log; the same
    command then resumes and ends on the weights of an uninterrupted run, bit for bit. Returns the frozen run's
    log and seconds and the resumed run's log."""
    from paddle_alignment import watchdog

    assert run_grpo_process(world, tmp_path / "straight", **changes).returncode == 0
    started = time.monotonic()
    frozen = run_grpo_process(world, tmp_path / "out", freeze, **{**changes, **(frozen_changes or {})})
    seconds = time.monotonic() - started
    assert frozen.returncode == (watchdog.EXIT_CODE if exit_code is None else exit_code), frozen.stderr[-3000:]
    found = re.search(message, frozen.stderr)
    assert found, frozen.stderr[-3000:]
    resumed = run_grpo_process(world, tmp_path / "out", **changes)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight, ended = weights(tmp_path / "straight" / "policy"), weights(tmp_path / "out" / "policy")
    for name in straight:
        np.testing.assert_array_equal(ended[name], straight[name], err_msg=name)
    return SimpleNamespace(found=found, log=frozen.stderr, seconds=seconds, resumed_log=resumed.stderr)


def weights(path):
    model = AutoModelForCausalLM.from_pretrained(path)
    return {name: value.numpy() for name, value in model.state_dict().items()}


# ---- from test_reward_server.py, shared with other test files ----------------------------------------


def protocol_only_app(environ, start_response):
    """A minimal WSGI reward server of the arith task with only `POST /`, as PaddleNLP's has no /health."""
    if (environ["REQUEST_METHOD"], environ["PATH_INFO"]) != ("POST", "/"):
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [b'{"detail": "Not Found"}']
    body = json.loads(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"])))
    scores = get_reward_task("arith").score_batch(body["src"], body["tgt"], body["response"]).scores
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"error_code": 0, "error_msg": "Success", "score": scores}).encode()]


# ---- from test_ppo_algos.py, shared with other test files ----------------------------------------


def numpy_gae(token_rewards, values, lengths, gamma, lam):
    advantages = np.zeros_like(token_rewards)
    for row, length in enumerate(lengths):
        running = 0.0
        for step in reversed(range(length)):
            next_value = values[row, step + 1] if step + 1 < length else 0.0
            delta = token_rewards[row, step] + gamma * next_value - values[row, step]
            running = delta + gamma * lam * running
            advantages[row, step] = running
    return advantages


# ---- from test_config.py, shared with other test files ----------------------------------------


BASE = {
    "rl_algorithm": "grpo",
    "actor_model_name_or_path": "unused-model-path",
    "train_datasets": "unused.jsonl",
    "output_dir": "unused-output",
    "device": "cpu",
    "use_rule_reward": True,
    "reward_task": "arith",
    "rollout_n": 4,
    "per_device_prompt_batch_size": 2,
    "per_device_train_batch_size": 4,
    "max_steps": 3,
    "max_prompt_len": 16,
    "max_dec_len": 8,
    "max_length": 32,
}


def parse(tmp_path, **changes):
    config = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return parse_arguments([str(path)])
