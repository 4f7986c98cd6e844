"""The reference's log-probs in preference training: none (reference-free), a frozen model run on every batch
(PaddleNLP's and TRL's default), the policy with its LoRA adapters off, or precomputed once over the data set and
kept on disk (TRL's precompute_ref_log_probs, here cached across runs)."""

import hashlib
import json
import logging
import os

import numpy as np
import paddle

from paddle_alignment.checkpoints.saving import is_first_rank
from paddle_alignment.data.preference import fingerprint
from paddle_alignment.distributed import barrier, rank_shard, sum_over_data_ranks
from paddle_alignment.models.lora_utils import adapters_disabled
from paddle_alignment.models.packed_sequences import pack_groups, packed_sequence_stats
from paddle_alignment.models.tensor_parallel import is_dist_tensor, local_value
from paddle_alignment.preference.batches import group_batches, group_of, sequence_order
from paddle_alignment.rollout.decode import eval_mode

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1


class Reference:
    """Log-prob sums [S] of a packed batch under the reference: `model` (frozen), else the policy with its LoRA
    adapters off, else zeros (`free`); with `precomputed`, every batch brings its own. `forwards` counts the
    reference forwards run (those of the precomputation included)."""

    def __init__(self, model=None, free=False, precomputed=False, chunk_tokens=512, forwards=0):
        self.model, self.free, self.precomputed, self.chunk_tokens = model, free, precomputed, chunk_tokens
        self.forwards = forwards

    @paddle.no_grad()
    def logp_sums(self, policy, batch):
        if self.free:
            return paddle.zeros([batch.num_sequences], dtype="float32")
        if self.precomputed:
            raise RuntimeError("the reference log-probs were precomputed, but this batch came without them")
        self.forwards += 1
        if self.model is None:
            with eval_mode(policy), adapters_disabled(policy):
                return packed_sequence_stats(policy, batch, self.chunk_tokens).logp_sums
        return packed_sequence_stats(self.model, batch, self.chunk_tokens).logp_sums

    @paddle.no_grad()
    def mix_in(self, policy, alpha):
        """TR-DPO's update: reference = alpha x policy + (1 - alpha) x reference, weight by weight."""
        policy_state = policy.state_dict()
        for name, weight in self.model.state_dict().items():
            weight.set_value(alpha * policy_state[name].astype(weight.dtype) + (1 - alpha) * weight)


def weights_signature(path):
    """The files of a model folder that decide its outputs (weights, configs), each with its size and mtime."""
    files = sorted(
        name for name in os.listdir(path)
        if name.endswith((".safetensors", ".pdparams", ".json", ".bin")) and not name.startswith("trainer_state")
    )
    signature = []
    for name in files:
        stat = os.stat(os.path.join(path, name))
        signature.append([name, stat.st_size, stat.st_mtime_ns])
    return signature


def cache_path(cache_dir, records, reference_path, dtype):
    """The cache file of the reference log-probs of `records` under the model at `reference_path` in `dtype`:
    named by a digest of the records' token ids (so of the data, the cut and the tokenizer), the reference's files
    and the precision."""
    key = {"format": CACHE_FORMAT, "data": fingerprint(records), "reference": weights_signature(reference_path), "dtype": str(dtype)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return os.path.join(cache_dir, f"{digest}.npy")


def cached_reference(path, groups, replies):
    """The cached [groups, replies] log-prob sums at `path`, or None."""
    if not os.path.isfile(path):
        return None
    values = np.load(path)
    if values.shape != (groups, replies):
        raise ValueError(f"{path} holds reference log-probs of shape {values.shape}, not ({groups}, {replies}): remove it")
    return values


def compute_reference(reference, policy, records, pad_token_id, batch_size):
    """[groups, replies] reference log-prob sums of every group of `records`: each data rank computes its share,
    and the shares are summed over the ranks."""
    shard = rank_shard(len(records))
    replies = len(group_of(records[0])[1])
    values = np.zeros((len(records), replies), dtype="float64")
    for batch_indices in group_batches(len(shard), batch_size):
        groups = [shard[i] for i in batch_indices]
        batch = pack_groups([group_of(records[g]) for g in groups], pad_token_id)
        values[groups] = sequence_order(reference.logp_sums(policy, batch).numpy(), len(groups))
    return sum_over_data_ranks(paddle.to_tensor(values), "reference log-probs").numpy()


def save_reference(path, values):
    """Write the cache file (the first rank; a temporary file renamed, so a crash leaves no partial cache) and
    wait for it on every rank."""
    if is_first_rank():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            np.save(f, values)
        os.replace(path + ".tmp", path)
    barrier()


def reference_weights_file(folder):
    """Where a checkpoint keeps this rank's reference weights (TR-DPO moves them away from the model's)."""
    return os.path.join(folder, f"reference.rank{paddle.distributed.get_rank():02d}.pdparams")


def save_reference_weights(model, folder):
    paddle.save({name: local_value(value) for name, value in model.state_dict().items()}, reference_weights_file(folder))


def load_reference_weights(model, folder):
    """The reference weights a checkpoint kept into `model`; the file missing stops the run naming it."""
    path = reference_weights_file(folder)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist: ref_model_update_steps resumes the reference a checkpoint kept")
    state = paddle.load(path)
    for name, weight in model.state_dict().items():
        if is_dist_tensor(weight):
            raise ValueError("resuming ref_model_update_steps under tensor parallel is not implemented: resume at "
                             "tensor_parallel_degree 1, or restart the run")
        weight.set_value(state[name])
