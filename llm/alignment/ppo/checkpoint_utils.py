"""Checkpoint helpers: atomic folders, RNG states of every rank, optimizer state keyed by parameter paths."""

import contextlib
import os
import random
import shutil

import numpy as np
import paddle
import paddle.distributed as dist

from llm.alignment.ppo.comm_utils import is_distributed


def collect_rng_states():
    """Every rank's RNG states (python, numpy, paddle), in the layout Trainer._load_rng_state reads."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cuda": paddle.get_rng_state(),
        "cpu": paddle.framework.core.default_cpu_generator().get_state(),
    }
    if not is_distributed():
        return [state]
    states = []
    dist.all_gather_object(states, state)
    return states


def barrier():
    if is_distributed():
        dist.barrier()


@contextlib.contextmanager
def atomic_directory(path):
    """Yield a temp folder beside `path`; on success it replaces `path` in one rename, on error it is removed."""
    parent, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".tmp-{name}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(path):
        old = os.path.join(parent, f".old-{name}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old)
    else:
        os.rename(tmp, path)


def optimizer_state_by_structured_name(optimizer, model):
    """The optimizer state with each parameter's generated name (e.g. `linear_12.w_0`) replaced by its path
    in the model (e.g. `qwen2.layers.0.mlp.up_proj.weight`), so a checkpoint loads into any new instance."""
    return rename_state_keys(optimizer.state_dict(), {p.name: n for n, p in model.named_parameters()})


def load_optimizer_state(optimizer, model, state):
    optimizer.set_state_dict(rename_state_keys(state, {n: p.name for n, p in model.named_parameters()}))


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
