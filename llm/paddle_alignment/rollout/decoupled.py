"""Decoupled rollout: sampler processes generate the next batches while the trainer learns.

Rank 0 of the trainer starts one sampler process per entry of `rollout_devices` (rollout/sampler.py, with
the trainer's own arguments) and publishes the policy weights after every RL step (rollout/weights.py);
trainer rank r sends its requests to sampler r % samplers. A request names the policy version that must
sample it (the RL steps done when it was sent), so a batch taken at step k was sampled by version
k - 1 - max_staleness or later, and runs are reproducible: the same seed gives the same batches whatever the
timing.

Transport: ZeroMQ (pyzmq) DEALER/ROUTER sockets over an `ipc://` socket in a private temp folder (only
this user can connect), the messages pickled (both ends are this run's own processes). Weights go
through files rather than messages so that a sampler always reads a complete, versioned copy and the
trainer never waits for a sampler to receive them.

Faults: a sampler that exits or reports an error stops the trainer with its message and the tail of its
log (checked every half second while the trainer waits); a sampler exits when the trainer's rank 0 exits
(the kernel signals it) or stops publishing weights it waits for. close() stops the samplers, and runs on
any exit of the training loop, Ctrl-C included.
"""

import atexit
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque

import paddle.distributed as dist
import zmq
from paddlenlp.utils.log import logger

import paddle_alignment
from paddle_alignment.config.paddlenlp_keys import ALIASES, split_options
from paddle_alignment.cpu_runtime import openmp_workers_sleep_when_idle
from paddle_alignment.distributed import barrier, collective, data_parallel_rank_and_size, tensor_parallel_group
from paddle_alignment.rollout import weights
from paddle_alignment.rollout.engines import Rollout, RolloutBatch
from paddle_alignment.watchdog import Deadline

SAMPLER_MODULE = "paddle_alignment.rollout.sampler"
POLL_MS = 500
LOG_TAIL_LINES = 30


def ready_file(folder, index):
    """Written by sampler `index` once it serves: its pid and endpoint (JSON)."""
    return os.path.join(folder, f"sampler-{index}.json")


def log_file(folder, index):
    return os.path.join(folder, f"sampler-{index}.log")


def process_alive(pid):
    """Whether process `pid` runs (on this machine; a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def log_tail(path, lines=LOG_TAIL_LINES):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def share_cores_with_samplers(samplers):
    """With `samplers` CPU sampler processes on this machine, the trainer keeps its MKL threads and lends the
    samplers the cores those threads leave between matrix products: its OpenMP workers sleep as soon as a
    product ends, and the samplers run at idle priority (sampler.py), so they never delay the trainer.
    Measured on 2 cores (see docs/decoupled_rollout.md): where the update is the longer side, this beat
    one MKL thread each, a normal-priority sampler, and the trainer's threads spinning; where the rollout is,
    the user's MKL_NUM_THREADS=1 (kept, as every MKL setting of the user's) leaves the sampler a core."""
    if samplers and not openmp_workers_sleep_when_idle():
        logger.warning("this paddle has no Intel OpenMP: its MKL threads may keep the CPU samplers waiting")


def sampler_environment(device):
    """The trainer's environment without paddle.distributed's launch variables (a sampler is a process of
    its own), on its GPU, with this repository importable. A CPU sampler runs on one thread (MKL's and
    OpenMP's), at idle priority (see share_cores_with_samplers)."""
    env = {
        key: value for key, value in os.environ.items()
        if not (key.startswith("PADDLE_") and not key.startswith("PADDLE_ALIGNMENT_")) and not key.startswith("FLAGS_selected_")
    }
    if device != "cpu":
        env["CUDA_VISIBLE_DEVICES"] = device
    else:
        env.update(MKL_NUM_THREADS="1", OMP_NUM_THREADS="1")
    # The folder holding the trainer's paddle_alignment, so that the sampler imports the same code.
    root = os.path.dirname(os.path.dirname(os.path.abspath(paddle_alignment.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def whole_model_argv(trainer_argv):
    """The trainer's arguments for a sampler, one process holding whole models: tensor_parallel_degree 1
    (the trainer's published weights are whole), in place of any the command line set under any name."""
    names = {"tensor_parallel_degree"} | {alias for alias, key in ALIASES.items() if key == "tensor_parallel_degree"}
    config, options = trainer_argv[0], split_options(trainer_argv[1:])
    kept = [token for key, values in options if key not in names for token in (f"--{key}", *values)]
    return [config, *kept, "--tensor_parallel_degree", "1"]


class DecoupledRollout(Rollout):
    """Requests go to a sampler process as soon as they are made; `take` waits for the oldest's batch."""

    def __init__(self, args, argv, worker):
        super().__init__(worker)
        self.args, self.argv = args, list(argv)
        self.lookahead = args.max_staleness
        self.folder = args.rollout_dir
        self.processes, self.socket_dir = [], None
        self.context = self.socket = self.sampler = None
        self.in_flight = deque()  # the policy version each request in flight names, oldest first
        self.deadline = Deadline(args.rollout_timeout, "rollout_timeout")
        self.version = None
        self.group = None  # the tensor-parallel group, whose first rank talks to the sampler for all

    # ---- life cycle ---------------------------------------------------------------------------------

    def start(self, version, offload):
        """`version` of the worker's policy is published and rank 0 starts the samplers; every rank connects to
        its data rank's sampler."""
        super().start(version, offload)
        self.version = version
        self.group = tensor_parallel_group()
        if dist.get_rank() == 0:
            os.makedirs(self.folder, exist_ok=True)
            self.remove_run_files()
        barrier()  # rank 0 removed an earlier run's files: the ready files read below are this run's
        self.worker.publish_weights(self.folder, version, keep=0)
        if dist.get_rank() == 0:
            self.start_samplers()
        self.sampler = self.wait_ready(data_parallel_rank_and_size()[0] % len(self.args.sampler_devices))
        share_cores_with_samplers(self.args.sampler_devices.count("cpu"))
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(self.sampler["endpoint"])

    def start_samplers(self):
        self.socket_dir = tempfile.mkdtemp(prefix="paddle-alignment-rollout-")
        atexit.register(self.close)
        for index, device in enumerate(self.args.sampler_devices):
            command = [
                sys.executable, "-m", SAMPLER_MODULE, "--index", str(index), "--rollout_dir", self.folder,
                "--endpoint", f"ipc://{self.socket_dir}/sampler-{index}", "--trainer_pid", str(os.getpid()),
                *(["--idle_priority"] if device == "cpu" else []),
                "--", *whole_model_argv(self.argv),
            ]
            with open(log_file(self.folder, index), "w") as log:
                self.processes.append(
                    subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=sampler_environment(device))
                )

    def wait_ready(self, index):
        """Sampler `index`'s ready file, once it serves."""
        deadline = time.monotonic() + self.deadline.seconds()
        path = ready_file(self.folder, index)
        while not os.path.exists(path):
            if self.processes and self.processes[index].poll() is not None:
                self.fail(index, f"exited with code {self.processes[index].returncode} while starting")
            if time.monotonic() > deadline:
                self.fail(index, f"was not ready within {self.deadline.describe()}")
            time.sleep(0.05)
        with open(path) as f:
            return json.load(f) | {"index": index}

    def close(self):
        if self.socket is not None:
            self.socket.close(linger=0)
            self.context.term()
            self.socket = None
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self.socket_dir is not None:  # rank 0 started samplers: remove what only they read
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
            self.remove_run_files()
        self.processes = []

    def remove_run_files(self):
        """The published weights and the samplers' ready files (their logs stay, for reading after a run)."""
        weights.remove_all(self.folder)
        for index in range(len(self.args.sampler_devices)):
            if os.path.exists(ready_file(self.folder, index)):
                os.remove(ready_file(self.folder, index))

    # ---- requests -----------------------------------------------------------------------------------

    def leads(self):
        """Whether this rank talks to the sampler: the first of its tensor-parallel group, which shares the
        batch with the others (they hold the same data), or every rank without tensor parallel."""
        return self.group is None or dist.get_rank() == self.group.ranks[0]

    def request(self, items, seed, version):
        # The sampler waits for that version's weights at most as long as the trainer waits for its batch.
        request = {"items": items, "seed": seed, "version": version, "timeout": self.deadline.seconds()}
        if self.leads():
            self.socket.send(pickle.dumps(request, protocol=5))
        self.in_flight.append(version)

    def requested(self):
        return len(self.ready) + len(self.in_flight)

    def take(self):
        return self.ready.popleft() if self.ready else self.receive()

    def drain(self):
        while self.in_flight:
            self.ready.append(self.receive())
        return super().drain()

    def receive(self):
        """The oldest in-flight request's batch, from the sampler or, within a tensor-parallel group, from the
        rank that leads it."""
        if self.group is None:
            return self.receive_from_sampler()
        shared = [self.receive_from_sampler() if self.leads() else None]
        with collective("the rollout batch shared over the tensor-parallel group"):
            dist.broadcast_object_list(shared, src=self.group.ranks[0], group=self.group)
        if not self.leads():
            self.in_flight.popleft()
        return shared[0]

    def receive_from_sampler(self):
        """The oldest in-flight request's batch; stops with the sampler's message when it fails or exits."""
        deadline = time.monotonic() + self.deadline.seconds()
        while not self.socket.poll(POLL_MS):
            if not process_alive(self.sampler["pid"]):
                self.fail(self.sampler["index"], "exited")
            if time.monotonic() > deadline:
                self.fail(self.sampler["index"], (
                    f"sent no batch within {self.deadline.describe()}: the trainer, at policy version {self.version}, "
                    f"waits for the batch of policy version {self.in_flight[0]}; resume from the last checkpoint by "
                    "running the same command again"
                ))
        reply = pickle.loads(self.socket.recv())
        self.in_flight.popleft()
        if "error" in reply:
            self.fail(self.sampler["index"], f"failed:\n{reply['error']}")
        return RolloutBatch.from_numpy(reply["batch"])

    def fail(self, index, what):
        raise RuntimeError(
            f"rollout sampler {index} {what}. Last lines of its log {log_file(self.folder, index)}:\n"
            f"{log_tail(log_file(self.folder, index))}"
        )

    def policy_updated(self, version):
        self.version = version
        # A request names a version at most max_staleness steps old when sent, and other ranks may send
        # theirs a step later: older files are never read again.
        self.worker.publish_weights(self.folder, version, keep=self.lookahead + 2)
