"""Every weight sync verified: a sampler that loads policy version v must compute what the trainer's v computes.

The trainer, when it publishes version v (rollout/weights.py), records beside the weights the log-probs its
policy gives a fixed probe batch (random token ids, the same in every process: `probe_batch`), through the
pass the samplers use for the behaviour log-probs (`RolloutWorker.batch_logprobs`), and a digest of its frozen
parameters (sum and sum of squares of each; they never change, so it is computed once). A sampler, once it
has loaded v, computes the probe's log-probs too: further apart than `rollout_sync_tolerance`, the run stops
with an error naming the version, the sampler and the parameter that differs most, found only then: each
trained parameter against the value the file holds, each frozen one against the trainer's digest.
That catches weights that never reached the model that samples (verl #7495: a LoRA adapter that never
reached the engine, taken for staleness for months), a stale or partial load, and a sampler whose frozen
weights differ from the trainer's, each of which otherwise only bends the curves. Its cost per version is
the two probe forwards: nothing is digested or compared while the log-probs agree. Where the native decoder op
runs the policy (a float32 CPU model), the probe is one call of it with inputs made once per model (on one
MKL thread for a small model: NativeProbe); elsewhere it is the micro-batch pass of the behaviour log-probs
(`RolloutWorker.batch_logprobs`). Both sides take the same path, since they run the same config.
"""

import contextlib
import weakref
from functools import lru_cache

import numpy as np
import paddle

from paddle_alignment.cpu_runtime import mkl_local_threads
from paddle_alignment.experience import Experience
from paddle_alignment.models.fused_kernels import token_logprobs_and_entropy
from paddle_alignment.models.native_forward import NativeDecoder
from paddle_alignment.rollout.weights import host_array, trained_state

PROBE_ROWS, PROBE_PROMPT_TOKENS, PROBE_RESPONSE_TOKENS = 1, 4, 4
PROBE_SEED = 20261125
DIGEST_CHUNK = 1 << 20  # values converted to float64 at a time: no float64 copy of a whole embedding
FROZEN_DIGESTS = weakref.WeakKeyDictionary()  # the trainer's policy -> its frozen parameters' digest
NATIVE_PROBES = weakref.WeakKeyDictionary()  # a policy -> the native op's probe inputs (NativeProbe)


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


def probe_logprobs(worker):
    """[PROBE_ROWS, PROBE_RESPONSE_TOKENS] float32: `worker.policy`'s log-probs of the probe at the sampling
    temperature, in one forward."""
    policy = worker.policy
    probe = probe_batch(policy.config.vocab_size)
    with worker.offload.on_device("train_model"):
        native = NativeDecoder.for_model(policy)
        if native is None:
            return worker.batch_logprobs(policy, None, probe).numpy().astype("float32")
        if policy not in NATIVE_PROBES:
            NATIVE_PROBES[policy] = NativeProbe(native, probe.input_ids)
        return NATIVE_PROBES[policy].logprobs(native, worker.sampling.temperature)


class NativeProbe:
    """The probe through the native decoder op: its inputs (positions, mask, cache, rotary tables), made once
    per model, and the log-probs of the logits it returns (the trainer's token_logprobs_and_entropy). On a
    model under SMALL_MODEL_PARAMETERS the probe's products are too small for MKL's second thread to pay for
    its wake-up, and they run on one: beside a busy sampler, two threads doubled the trainer's side
    (docs/decoupled_rollout.md)."""

    SMALL_MODEL_PARAMETERS = 1 << 24

    def __init__(self, native, input_ids):
        rows, length = input_ids.shape
        self.inputs = (input_ids, paddle.tile(paddle.arange(length, dtype="int64")[None], [rows, 1]),
                       paddle.ones([rows, length], dtype="int64"), native.new_cache(rows, length),
                       native.rope_tables(length))
        self.labels = input_ids[:, PROBE_PROMPT_TOKENS:]
        self.one_thread = native.parameters < self.SMALL_MODEL_PARAMETERS

    def logprobs(self, native, temperature):
        length = self.inputs[0].shape[1]
        with mkl_local_threads(1) if self.one_thread else contextlib.nullcontext():
            logits = native(*self.inputs, 0, PROBE_PROMPT_TOKENS - 1, length - 1)
        return token_logprobs_and_entropy(logits, self.labels, temperature)[0].numpy()


def frozen_parameters(model, trained):
    """(name, parameter) of `model`'s parameters not named in `trained` (those the trainer trains and publishes:
    the rest are a LoRA policy's base weights, or none), sorted by name."""
    return sorted(((name, p) for name, p in model.named_parameters() if name not in trained), key=lambda item: item[0])


def parameter_digest(parameters):
    """[len(parameters), 2] float64: each (name, parameter)'s sum and sum of squares."""
    digest = np.empty([len(parameters), 2], dtype="float64")
    for row, (_, parameter) in enumerate(parameters):
        values = host_array(parameter).ravel()
        total = squares = 0.0
        for start in range(0, values.size, DIGEST_CHUNK):
            chunk = float64_values(values[start : start + DIGEST_CHUNK])
            total, squares = total + chunk.sum(), squares + chunk @ chunk
        digest[row] = total, squares
    return digest


def float64_values(array):
    """`array`'s values in float64; a bfloat16 tensor's host array holds its bits as uint16 (host_array)."""
    if array.dtype == np.uint16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype("float64")


def record(worker):
    """What the trainer publishes with a version: the probe's log-probs under `worker.policy`, and the digest
    of its frozen parameters."""
    policy = worker.policy
    if policy not in FROZEN_DIGESTS:
        FROZEN_DIGESTS[policy] = parameter_digest(frozen_parameters(policy, trained_state(policy)))
    return {"probe_logprobs": probe_logprobs(worker), "frozen_digest": FROZEN_DIGESTS[policy]}


def verify(worker, recorded, published, version, engine, tolerance):
    """Raise when `worker.policy`, just loaded with `version` (whose trained parameters the trainer published
    as `published`, name -> array), gives the probe other log-probs than the trainer `recorded`; `engine`
    names the sampler in the message."""
    gap = float(np.abs(probe_logprobs(worker) - recorded["probe_logprobs"]).max())
    if gap <= tolerance:
        return
    raise RuntimeError(
        f"weight sync check failed: {engine} loaded policy version {version}, but its probe log-probs differ from "
        f"the trainer's by up to {gap:.4g} (rollout_sync_tolerance {tolerance:g}); "
        + differing_parameter(worker.policy, published, recorded["frozen_digest"])
    )


def differing_parameter(model, published, frozen_digest):
    """Which parameter differs most from the trainer's, in words: a trained one against its `published` value,
    or a frozen one against the trainer's `frozen_digest`."""
    state = model.state_dict()  # it holds every published name: loading checked that
    differences = []  # (relative difference, name, how it differs)
    for name, theirs in published.items():
        mine, theirs = (float64_values(array) for array in (host_array(state[name]), theirs))
        difference = float(np.abs(mine - theirs).max()) if mine.shape == theirs.shape else np.inf
        differences.append((difference / (float(np.abs(theirs).max()) + 1e-12), name,
                            f"largest difference {difference:.6g} from the value the trainer published"))
    frozen = frozen_parameters(model, published)
    if len(frozen) != len(frozen_digest):
        return f"and it has {len(frozen)} frozen parameters where the trainer's policy has {len(frozen_digest)}"
    for (name, _), mine, theirs in zip(frozen, parameter_digest(frozen), frozen_digest):
        differences.append((float(np.abs(mine - theirs).max() / (np.abs(theirs).max() + 1e-12)), name,
                            f"frozen: sum {mine[0]:.6g}, sum of squares {mine[1]:.6g}; "
                            f"the trainer's {theirs[0]:.6g}, {theirs[1]:.6g}"))
    relative, name, how = max(differences, default=(0.0, None, None))
    if relative == 0:
        return ("yet every parameter equals the trainer's: the two passes compute differently (precision or "
                "kernels); raise rollout_sync_tolerance if that gap is expected")
    return f"the parameter that differs most: {name} ({how})"
