"""Every weight sync verified: a sampler that loads policy version v must compute what the trainer's v computes.

The trainer, when it publishes version v (rollout/weights.py), records two things beside the weights: the
log-probs its policy gives a fixed probe batch (random token ids, the same in every process: `probe_batch`),
through the same pass the samplers use for the behaviour log-probs (`RolloutWorker.compute_logprobs`), and a
digest of every parameter (its sum and sum of squares, frozen base weights included). A sampler, once it has
loaded v, computes the same two and compares: probe log-probs further apart than `rollout_sync_tolerance`
stop the run with an error naming the version, the sampler and the parameter whose digest differs most.
That catches weights that never reached the model that samples (verl #7495: a LoRA adapter that never
reached the engine, taken for staleness for months), a stale or partial load, and a sampler whose frozen
weights differ from the trainer's, each of which otherwise only bends the curves.
"""

from functools import lru_cache

import numpy as np
import paddle

from paddle_alignment.experience import Experience
from paddle_alignment.rollout.weights import host_array

PROBE_ROWS, PROBE_PROMPT_TOKENS, PROBE_RESPONSE_TOKENS = 2, 8, 8
PROBE_SEED = 20261125
DIGEST_CHUNK = 1 << 20  # values converted to float64 at a time: no float64 copy of a whole embedding


@lru_cache(maxsize=None)
def probe_batch(vocab_size):
    """The fixed probe: PROBE_ROWS rows of random prompt and response token ids below `vocab_size`."""
    rng = np.random.default_rng(PROBE_SEED)
    ids = rng.integers(0, vocab_size, (PROBE_ROWS, PROBE_PROMPT_TOKENS + PROBE_RESPONSE_TOKENS))
    rows = [""] * PROBE_ROWS
    return Experience(
        input_ids=paddle.to_tensor(ids, dtype="int64"),
        attention_mask=paddle.ones(ids.shape, dtype="int64"),
        response_mask=paddle.ones([PROBE_ROWS, PROBE_RESPONSE_TOKENS], dtype="float32"),
        group_index=paddle.arange(PROBE_ROWS, dtype="int64"),
        finished=paddle.ones([PROBE_ROWS], dtype="bool"),
        prompts=rows, labels=rows, responses=rows,
    )


def named_parameters(model):
    """(name, parameter) of every parameter, frozen ones included, sorted by name."""
    return sorted(model.named_parameters(), key=lambda item: item[0])


def parameter_digest(model):
    """[parameters, 2] float64: each parameter's sum and sum of squares, in named_parameters' order."""
    parameters = named_parameters(model)
    digest = np.empty([len(parameters), 2], dtype="float64")
    for row, (_, parameter) in enumerate(parameters):
        values = host_array(parameter).ravel()
        total = squares = 0.0
        for start in range(0, values.size, DIGEST_CHUNK):
            chunk = values[start : start + DIGEST_CHUNK].astype("float64")
            total, squares = total + chunk.sum(), squares + chunk @ chunk
        digest[row] = total, squares
    return digest


def record(worker):
    """What the trainer publishes with a version: the probe's log-probs and the parameter digest of
    `worker.policy`."""
    with worker.offload.on_device("train_model"):
        logprobs = worker.compute_logprobs(worker.policy, probe_batch(worker.policy.config.vocab_size))
    return {"probe_logprobs": logprobs.numpy().astype("float32"), "digest": parameter_digest(worker.policy)}


def verify(worker, recorded, version, engine, tolerance):
    """Raise when `worker.policy` (just loaded with `version`) gives the probe other log-probs than the
    trainer `recorded`; `engine` names the sampler in the message."""
    mine = record(worker)
    gap = float(np.abs(mine["probe_logprobs"] - recorded["probe_logprobs"]).max())
    if gap <= tolerance:
        return
    raise RuntimeError(
        f"weight sync check failed: {engine} loaded policy version {version}, but its probe log-probs differ from "
        f"the trainer's by up to {gap:.4g} (rollout_sync_tolerance {tolerance:g}); "
        + differing_parameter(worker.policy, mine["digest"], recorded["digest"])
    )


def differing_parameter(model, mine, theirs):
    """Which parameter's digest differs most from the trainer's, in words."""
    if mine.shape != theirs.shape:
        return f"and it has {len(mine)} parameters where the trainer's policy has {len(theirs)}"
    names = [name for name, _ in named_parameters(model)]
    relative = np.abs(mine - theirs).max(axis=1) / (np.abs(theirs).max(axis=1) + 1e-12)
    worst = int(relative.argmax())
    if relative[worst] == 0:
        return ("yet every parameter equals the trainer's: the two passes compute differently (precision or "
                "kernels); raise rollout_sync_tolerance if that gap is expected")
    return (f"the parameter that differs most: {names[worst]} (sum {mine[worst, 0]:.6g}, sum of squares "
            f"{mine[worst, 1]:.6g}; the trainer's {theirs[worst, 0]:.6g}, {theirs[worst, 1]:.6g})")
