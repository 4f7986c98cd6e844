"""run_ppo with one part frozen for good, as a stalled file system or a stopped peer would freeze it:

    python tests/probes/frozen_run.py checkpoint-write:N CONFIG.json [--key value ...]
    python tests/probes/frozen_run.py weight-publication:N CONFIG.json --rollout_mode decoupled ...
    python -m paddle.distributed.launch --nproc_per_node 2 tests/probes/frozen_run.py rank-1:N CONFIG.json ...

`checkpoint-write:N`: writing checkpoint-N blocks forever (inside the checkpoint's temp folder, as a write to a
hung disk). `weight-publication:N`: publishing policy version N for the samplers blocks forever.
`sampler:N`: the trainer stops its samplers (SIGSTOP) once checkpoint-N is written. `rank-1:N`: rank 1 stops itself (SIGSTOP) once checkpoint-N is written, so the other rank's next
collective never completes. `kill-rank-R:N`: global rank R ends itself with SIGKILL (kill -9, no clean-up) once
checkpoint-N is written. Everything else is run_ppo's own, the watchdog included.
"""

import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from llm.alignment.ppo import run_ppo  # noqa: E402  (configures the CPU runtime before paddle loads)
from paddle_alignment.checkpoints import saving  # noqa: E402
from paddle_alignment.rollout import weights  # noqa: E402


def freeze_checkpoint_write(step):
    save_model = saving.save_model

    def stalling(model, folder, *args, **kwargs):
        if f"checkpoint-{step}" in folder:
            threading.Event().wait()
        return save_model(model, folder, *args, **kwargs)

    saving.save_model = stalling


def freeze_weight_publication(version):
    publish = weights.publish

    def stalling(state, folder, published, *args, **kwargs):
        if published == version:
            threading.Event().wait()
        return publish(state, folder, published, *args, **kwargs)

    weights.publish = stalling


def after_checkpoint(step, action):
    """Run `action(run)` once checkpoint-`step` is written (`run`: the RunState it holds)."""
    save_checkpoint = saving.save_checkpoint

    def saving_then_acting(run):
        save_checkpoint(run)
        if run.trainer_state.global_step == step:
            action(run)

    saving.save_checkpoint = saving_then_acting


def stop_samplers(run):
    for sampler in run.pending.processes:  # the trainer's decoupled rollout
        os.kill(sampler.pid, signal.SIGSTOP)


def stop_rank_1(run):
    if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 1:
        os.kill(os.getpid(), signal.SIGSTOP)


def kill_rank(rank):
    def kill(run):
        if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == rank:
            os.kill(os.getpid(), signal.SIGKILL)

    return kill


if __name__ == "__main__":
    what, step = sys.argv[1].split(":")
    if what.startswith("kill-rank-"):
        after_checkpoint(int(step), kill_rank(int(what[len("kill-rank-"):])))
        run_ppo.main(sys.argv[2:])
        sys.exit(0)
    freezes = {
        "checkpoint-write": freeze_checkpoint_write, "weight-publication": freeze_weight_publication,
        "sampler": lambda step: after_checkpoint(step, stop_samplers), "rank-1": lambda step: after_checkpoint(step, stop_rank_1),
    }
    freezes[what](int(step))
    run_ppo.main(sys.argv[2:])
