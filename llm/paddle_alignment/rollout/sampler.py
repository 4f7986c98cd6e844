"""A rollout sampler process of decoupled rollout (started by the trainer's rank 0, see rollout/decoupled.py).

    python -m paddle_alignment.rollout.sampler --index I --rollout_dir DIR --endpoint ipc://... \\
        --trainer_pid PID [--idle_priority] -- <the trainer's own arguments>

It builds a rollout worker from the trainer's arguments (tokenizer, policy with its LoRA adapters, reference
model, teacher, reward; no trainer, no critic, no datasets) and serves requests in order: load the policy version a
request names, sample its prompts with its seed, score them, and complete them with the behaviour policy's,
the reference's and the teacher's log-probs (ExperienceNeeds.for_sampler). Each event goes to its log (rollout_dir/sampler-<i>.log), whose last lines the trainer
shows when the sampler fails or misses its deadline.
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

from paddle_alignment.cpu_runtime import configure_cpu_runtime, run_at_idle_priority

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402
import zmq  # noqa: E402
from paddlenlp.trainer import set_seed  # noqa: E402

from paddle_alignment.config.arguments import parse_arguments  # noqa: E402
from paddle_alignment.models.loading import load_tokenizer  # noqa: E402
from paddle_alignment.models.precision import trainer_autocast  # noqa: E402
from paddle_alignment.models.rl_models import load_rl_models, load_teacher  # noqa: E402
from paddle_alignment.rewards.scoring import build_reward_scorer  # noqa: E402
from paddle_alignment.rollout.decode import greedy_responses  # noqa: E402
from paddle_alignment.rollout.decoupled import process_alive, ready_file  # noqa: E402
from paddle_alignment.rollout.engines import RolloutBatch  # noqa: E402
from paddle_alignment.rollout.worker import ExperienceNeeds, RolloutWorker  # noqa: E402

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


def build_worker(trainer_argv):
    """The rollout worker of the trainer's config: its policy (weights from the trainer, so never from a
    checkpoint), reference, teacher and reward, with the trainer's mixed precision."""
    model_args, _, training_args = parse_arguments(trainer_argv)
    training_args.resume_from_checkpoint = None
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path or model_args.actor_model_name_or_path, training_args.eos_token)
    policy, reference, reward_model, _ = load_rl_models(model_args, training_args, with_critic=False)
    reward_tokenizer = load_tokenizer(model_args.reward_model_name_or_path) if reward_model is not None else None
    return RolloutWorker(
        training_args, policy, tokenizer, build_reward_scorer(training_args, reward_model, reward_tokenizer, greedy_responses), reference,
        needs=ExperienceNeeds.for_sampler(training_args), autocast=trainer_autocast(training_args, policy),
        teacher=load_teacher(training_args, tokenizer),
    )


def sample(worker, request, folder, version, trainer_alive, engine):
    """The request's batch, sampled by the policy version it names (loaded and checked first when another is
    loaded, waiting for it at most the request's timeout; `engine` names this sampler); its idle seconds are
    those spent waiting for that version."""
    started = time.monotonic()
    if request["version"] != version:
        event(f"waiting for policy version {request['version']} (at most {request['timeout']:.0f} s)")
        worker.update_weights(folder, request["version"], request["timeout"], trainer_alive, engine)
        event(f"loaded and checked policy version {request['version']}")
    waited = time.monotonic() - started
    event(f"sampling {len(request['items'])} prompts with policy version {request['version']}, seed {request['seed']}")
    paddle.seed(request["seed"])  # generate() samples from paddle's generator
    exp, seconds = worker.generate_sequences(request["items"], request["seed"])
    return RolloutBatch(worker.complete(exp), request["version"], seconds, waited)


def event(what):
    print(f"{time.strftime('%H:%M:%S')} {what}", flush=True)


def serve(worker, endpoint, folder, index, trainer_alive):
    """Answer requests until the trainer exits; an error is sent to the requester, then raised."""
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(endpoint)
    announce(folder, index, endpoint)
    version, idle_since = None, time.monotonic()
    engine = f"rollout sampler {index} ({paddle.get_device()})"
    while True:
        if not socket.poll(500):
            if not trainer_alive():
                return
            continue
        requester, payload = socket.recv_multipart()
        waited_for_request = time.monotonic() - idle_since
        try:
            batch = sample(worker, pickle.loads(payload), folder, version, trainer_alive, engine)
        except Exception:
            socket.send_multipart([requester, pickle.dumps({"error": traceback.format_exc()})])
            raise
        version = batch.version
        batch.sampler_idle_seconds += waited_for_request
        socket.send_multipart([requester, pickle.dumps({"batch": batch.to_numpy()}, protocol=5)])
        event(f"sent the batch of policy version {version}")
        idle_since = time.monotonic()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--rollout_dir", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--trainer_pid", type=int, required=True)
    parser.add_argument("--idle_priority", action="store_true", help="a CPU sampler sharing the trainer's cores")
    parser.add_argument("trainer_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    exit_with(args.trainer_pid)
    if args.idle_priority:
        run_at_idle_priority()
    trainer_argv = args.trainer_argv[1:] if args.trainer_argv[:1] == ["--"] else args.trainer_argv
    serve(build_worker(trainer_argv), args.endpoint, args.rollout_dir, args.index, lambda: process_alive(args.trainer_pid))


if __name__ == "__main__":
    main()
