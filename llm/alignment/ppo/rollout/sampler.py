"""A rollout sampler process of decoupled rollout (started by the trainer's rank 0, see rollout/decoupled.py).

    python -m llm.alignment.ppo.rollout.sampler --index I --rollout_dir DIR --endpoint ipc://... \\
        --trainer_pid PID --timeout S [--idle_priority] -- <the trainer's own arguments>

It builds what the trainer's arguments describe for sampling (tokenizer, policy with its LoRA adapters,
reference model, reward) and serves requests in order: load the policy version a request names, sample
its prompts with its seed, score them, and record the behaviour policy's and the reference's log-probs.
"""

import argparse
import ctypes
import json
import os
import pickle
import signal
import sys
import time
import traceback

from llm.cpu_runtime import configure_cpu_runtime, run_at_idle_priority

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402
import zmq  # noqa: E402

from llm.alignment.ppo.rollout import weights  # noqa: E402
from llm.alignment.ppo.rollout.decoupled import process_alive, ready_file  # noqa: E402
from llm.alignment.ppo.rollout.engines import RolloutBatch  # noqa: E402

PR_SET_PDEATHSIG = 1


def exit_with(trainer_pid):
    """Have the kernel stop this process when the trainer's rank 0 exits, however it exits."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != trainer_pid:  # it exited before the request above
        sys.exit(f"the trainer (pid {trainer_pid}) exited before sampler start")


def announce(folder, index, endpoint):
    """The ready file, written whole (temp file + rename) so that a trainer rank never reads part of it."""
    path = ready_file(folder, index)
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "endpoint": endpoint}, f)
    os.replace(path + ".tmp", path)


def sample(trainer, request, folder, version, timeout, trainer_alive):
    """The request's batch, sampled by the policy version it names (loaded first when another is loaded);
    its idle seconds are those spent waiting for that version."""
    started = time.monotonic()
    if request["version"] != version:
        weights.wait_and_load(trainer.model, folder, request["version"], timeout, trainer_alive)
    waited = time.monotonic() - started
    paddle.seed(request["seed"])  # generate() samples from paddle's generator
    exp, seconds = trainer.sample(request["items"], request["seed"], behaviour_logprobs=True)
    return RolloutBatch(exp, request["version"], seconds, waited)


def serve(trainer, endpoint, folder, index, timeout, trainer_alive):
    """Answer requests until the trainer exits; an error is sent to the requester, then raised."""
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(endpoint)
    announce(folder, index, endpoint)
    version, idle_since = None, time.monotonic()
    while True:
        if not socket.poll(500):
            if not trainer_alive():
                return
            continue
        requester, payload = socket.recv_multipart()
        waited_for_request = time.monotonic() - idle_since
        try:
            batch = sample(trainer, pickle.loads(payload), folder, version, timeout, trainer_alive)
        except Exception:
            socket.send_multipart([requester, pickle.dumps({"error": traceback.format_exc()})])
            raise
        version = batch.version
        batch.sampler_idle_seconds += waited_for_request
        socket.send_multipart([requester, pickle.dumps({"batch": batch.to_numpy()}, protocol=5)])
        idle_since = time.monotonic()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--rollout_dir", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--trainer_pid", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--idle_priority", action="store_true", help="a CPU sampler sharing the trainer's cores")
    parser.add_argument("trainer_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    exit_with(args.trainer_pid)
    if args.idle_priority:
        run_at_idle_priority()
    from llm.alignment.ppo.run_ppo import build_trainer

    trainer_argv = args.trainer_argv[1:] if args.trainer_argv[:1] == ["--"] else args.trainer_argv
    trainer = build_trainer(trainer_argv, role="sampler")
    serve(trainer, args.endpoint, args.rollout_dir, args.index, args.timeout, lambda: process_alive(args.trainer_pid))


if __name__ == "__main__":
    main()
