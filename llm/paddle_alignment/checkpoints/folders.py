"""Checkpoint helpers: one run at a time in an output_dir, atomic folders written by every rank, finding,
resuming and rotating `checkpoint-N` folders, RNG states of every rank, optimizer state keyed by parameter
paths. What a checkpoint holds, and which rank writes each file, is checkpoint_io's."""

import contextlib
import fcntl
import os
import random
import shutil
import socket

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddlenlp.trainer.trainer import TRAINER_STATE_NAME
from paddlenlp.trainer.trainer_utils import _re_checkpoint
from paddlenlp.utils.log import logger

from paddle_alignment.distributed import SLICE_PREFIX, barrier, collective, hybrid_communicate_group, is_distributed


def collect_rng_states():
    """Every rank's RNG states (python, numpy, paddle and, under fleet hybrid parallel, its RNG tracker), in
    the layout Trainer._load_rng_state reads."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cuda": paddle.get_rng_state(),
        "cpu": paddle.framework.core.default_cpu_generator().get_state(),
    }
    if hybrid_communicate_group() is not None:
        state["hybrid_parallel_rng_state_tracker"] = fleet.meta_parallel.get_rng_state_tracker().get_states_tracker()
    if not is_distributed():
        return [state]
    states = []
    with collective("the gathering of the RNG states"):
        dist.all_gather_object(states, state)
    return states


def restore_rng_states(folder, file_name):
    """Set this rank's RNG states from `folder`/`file_name` (collect_rng_states' list, or one process's states),
    as paddlenlp's Trainer._load_rng_state does; without the file the run resumes, but not bit for bit."""
    path = os.path.join(folder, file_name)
    if not os.path.isfile(path):
        logger.warning(f"{folder} has no {file_name}: the resumed run draws other random numbers than an uninterrupted one")
        return
    saved = paddle.load(path, return_numpy=True)
    state = saved[dist.get_rank()] if isinstance(saved, list) else saved
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    paddle.framework.core.default_cpu_generator().set_state(state["cpu"])
    if paddle.is_compiled_with_cuda():
        paddle.set_rng_state(state["cuda"])
    tracker = state.get("hybrid_parallel_rng_state_tracker")
    if tracker is not None and hybrid_communicate_group() is not None:
        if hybrid_communicate_group().get_model_parallel_world_size() <= 1:
            tracker.pop("model_parallel_rng", None)  # registered only under tensor parallel (paddlenlp drops it too)
        fleet.meta_parallel.get_rng_state_tracker().set_states_tracker(tracker)


RUN_LOCK_NAME = ".run.lock"
# The open lock file of each output_dir (by real path) this process claimed (rank 0).
claimed_output_dirs = {}


def claim_output_dir(output_dir):
    """Rank 0 takes an exclusive lock on output_dir/.run.lock, held until release_output_dir, so that a second
    run in the same output_dir stops at start, before it picks or removes checkpoints, instead of writing its
    checkpoints between the first's. That happens when a crashed job is rerun while its processes still run (a
    killed `paddle.distributed.launch` leaves its workers running). The kernel releases the lock when the
    process exits, however it exits, so a crash leaves none. A second claim by the same process (a script or
    test building another trainer) keeps the lock it holds."""
    key = os.path.realpath(output_dir)
    if dist.get_rank() != 0 or key in claimed_output_dirs:
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, RUN_LOCK_NAME)
    while True:
        lock = open(path, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "its process is unknown"
            lock.close()
            raise RuntimeError(
                f"output_dir {output_dir} is in use by another run ({holder}): wait for it to end or stop it, "
                "or give this run another output_dir"
            ) from None
        if is_same_file(path, lock):
            break
        lock.close()  # a run that ended removed this file after it was opened: lock the file now there
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    claimed_output_dirs[key] = lock


def is_same_file(path, opened):
    try:
        return os.stat(path).st_ino == os.fstat(opened.fileno()).st_ino
    except FileNotFoundError:
        return False


def release_output_dir(output_dir):
    """Remove the lock file (a finished run leaves none) and release the lock."""
    lock = claimed_output_dirs.pop(os.path.realpath(output_dir), None)
    if lock is not None:
        with contextlib.suppress(FileNotFoundError):  # the folder may have been removed meanwhile
            os.remove(lock.name)  # still locked: a run that opened the file meanwhile finds it gone and retries
        lock.close()


@contextlib.contextmanager
def output_dir_claimed(output_dir):
    """Hold `output_dir` (claim_output_dir) inside the block, and release it after."""
    claim_output_dir(output_dir)
    try:
        yield
    finally:
        release_output_dir(output_dir)


@contextlib.contextmanager
def atomic_directory(path):
    """Every rank calls this and writes its files into the yielded temp folder beside `path`; once all have
    written, rank 0 puts the folder in place of `path` in one rename. A crash before that leaves only the
    temp folder, never a complete-looking `path`; on an error the temp folder is removed. The ranks share
    one file system (rank 0's folder)."""
    parent, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".tmp-{name}")
    first = dist.get_rank() == 0
    if first:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    barrier()
    try:
        yield tmp
    except BaseException:
        if first:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    barrier()  # every rank's files are in
    if first:
        replace_directory(tmp, path)
    barrier()


def replace_directory(source, path):
    """Rename `source` to `path`, replacing an existing `path` (moved aside first, then removed)."""
    if os.path.exists(path):
        parent, name = os.path.split(os.path.abspath(path))
        old = os.path.join(parent, f".old-{name}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
        os.rename(source, path)
        shutil.rmtree(old)
    else:
        os.rename(source, path)


def checkpoint_folders(output_dir):
    """{step: path} of the `checkpoint-N` folders in `output_dir` (not the `.tmp-`/`.old-` leftovers of atomic saves)."""
    if not os.path.isdir(output_dir):
        return {}
    found = {}
    for name in os.listdir(output_dir):
        match = _re_checkpoint.search(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            found[int(match.group(1))] = os.path.join(output_dir, name)
    return found


def last_complete_checkpoint(output_dir):
    """The highest-step checkpoint in `output_dir` that holds its trainer state, or None. paddlenlp's
    get_last_checkpoint checks completeness only on its PDC platform, so it would pick a stray folder."""
    folders = checkpoint_folders(output_dir)
    complete = [step for step, path in folders.items() if os.path.isfile(os.path.join(path, TRAINER_STATE_NAME))]
    return folders[max(complete)] if complete else None


def checkpoint_to_resume(output_dir):
    """What `resume_from_checkpoint true` resumes from: the last complete checkpoint in `output_dir`, which
    must hold one."""
    last = last_complete_checkpoint(output_dir)
    if last is None:
        raise FileNotFoundError(f"resume_from_checkpoint true: output_dir {output_dir} holds no complete checkpoint")
    return last


def resolve_resume_checkpoint(args, training):
    """Decide once, before any model loads, which checkpoint a run continues from, and set
    `args.resume_from_checkpoint` to its path or None (PaddleNLP's run_finetune convention):
    - a training run into an output_dir holding a complete checkpoint resumes from the last one, so rerunning
      a crashed job's command loses no work; `resume_from_checkpoint true` asks for exactly that and fails
      when there is none;
    - an explicit path is used as given;
    - `overwrite_output_dir` starts afresh and removes the old checkpoints first, so that rotation and
      auto-resume never mix two runs' folders;
    - an evaluation-only run (`training` false) neither resumes nor removes anything."""
    requested = args.resume_from_checkpoint
    # PdArgumentParser turns a JSON `true` into "True" and leaves a command-line `true` as "true".
    auto = str(requested).lower() == "true"
    if not training:
        if auto:
            raise ValueError("resume_from_checkpoint true continues training; an evaluation-only run takes a checkpoint path")
        return requested
    if args.overwrite_output_dir:
        if requested is not None:
            raise ValueError("overwrite_output_dir starts afresh: it contradicts resume_from_checkpoint, unset one of them")
        remove_checkpoints(args.output_dir)
        args.resume_from_checkpoint = None
        return None
    if requested is not None and not auto:
        return requested
    last = checkpoint_to_resume(args.output_dir) if auto else last_complete_checkpoint(args.output_dir)
    if last is not None:
        logger.info(f"resuming from {last}, the last checkpoint in output_dir; set overwrite_output_dir true to start afresh")
    args.resume_from_checkpoint = last
    return last


def remove_checkpoints(output_dir):
    """Remove every checkpoint folder in `output_dir`, with the leftovers of interrupted atomic saves (rank 0)."""
    if dist.get_rank() == 0 and os.path.isdir(output_dir):
        leftovers = [n for n in os.listdir(output_dir) if n.startswith((".tmp-checkpoint-", ".old-checkpoint-"))]
        removed = sorted(os.path.basename(p) for p in checkpoint_folders(output_dir).values()) + sorted(leftovers)
        for name in removed:
            shutil.rmtree(os.path.join(output_dir, name))
        if removed:
            logger.info(f"overwrite_output_dir: removed {', '.join(removed)} from {output_dir}")
    barrier()


def rotate_checkpoints(output_dir, limit, just_written):
    """Keep the newest `limit` checkpoints by step, and always `just_written` (its step): a higher-numbered
    one left by an earlier run must not push out the checkpoint this run depends on."""
    if not limit:
        return
    folders = checkpoint_folders(output_dir)
    for step in sorted(folders)[:-limit]:
        if step != just_written:
            shutil.rmtree(folders[step])


def optimizer_state_by_structured_name(optimizer, model):
    """The optimizer state with each parameter's generated name (e.g. `linear_12.w_0`) replaced by its path
    in the model (e.g. `qwen2.layers.0.mlp.up_proj.weight`), so a checkpoint loads into any new instance."""
    return rename_state_keys(optimizer.state_dict(), parameter_names(model, lambda path, name: (name, path)))


def optimizer_state_by_parameter_name(state, model):
    """The inverse of optimizer_state_by_structured_name, for `model`'s parameters (what set_state_dict reads)."""
    return rename_state_keys(state, parameter_names(model, lambda path, name: (path, name)))


def parameter_names(model, pair):
    """{key: value} of `pair(path, generated name)` for each parameter of `model`, and for the slice sharding
    stage 3 steps in its place (both names prefixed)."""
    pairs = [pair(path, parameter.name) for path, parameter in model.named_parameters()]
    return dict(pairs) | {SLICE_PREFIX + key: SLICE_PREFIX + value for key, value in pairs}


def rename_state_keys(state, names):
    """Rename keys `<old><suffix>` to `<new><suffix>` (accumulators are named after their parameter)."""
    by_length = sorted(names, key=len, reverse=True)

    def rename(key):
        old = next((o for o in by_length if key.startswith(o + "_") or key == o), None)
        return key if old is None else names[old] + key[len(old):]

    renamed = {}
    for key, value in state.items():
        renamed[rename(key)] = rename_state_keys(value, names) if isinstance(value, dict) and key == "master_weights" else value
    return renamed
