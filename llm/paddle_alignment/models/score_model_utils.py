"""Score normalizers (running statistics kept in persistable buffers) and end-of-sequence positions.

The normalizer state lives in buffers registered with `persistable=True`, so it is part of the owning
model's `state_dict()`: `save_pretrained` writes it and `from_pretrained` restores it with the weights.
"""

import paddle
import paddle.distributed as dist
from paddle import nn

from paddle_alignment.distributed import copies_of_each_batch, is_distributed
from paddle_alignment.models.tensor_parallel import local_value


def combine_moments(counts, means, variances):
    """Merge per-part population statistics into those of the union (exact, parallel-variance formula).

    counts [K], means [K, D], variances [K, D] -> (count scalar, mean [D], var [D]).
    Parts with count 0 carry weight 0; if all counts are 0, mean and var are 0.
    """
    total = counts.sum()
    weights = (counts / total.clip(min=1.0)).unsqueeze(-1)
    mean = (weights * means).sum(axis=0)
    var = (weights * (variances + (means - mean) ** 2)).sum(axis=0)
    return total, mean, var


def batch_moments(values, group=None):
    """Count, mean and population variance of `values` [N, D] (float64), over all data ranks when distributed,
    or over the ranks of `group`, each holding a batch of its own (a last pipeline stage's data ranks).

    Each rank all-gathers its own (count, mean, var) rather than the raw values, so ranks may hold
    different N; the merge is exact, identical to the statistics of the concatenated values. Without `group`,
    the ranks of a tensor-parallel group hold the same values (whole on each, from a split model's output):
    each batch counts once.
    """
    values = local_value(values).astype("float64")
    count = paddle.full([1], values.shape[0], dtype="float64")
    if values.shape[0] > 0:
        mean, var = values.mean(axis=0), values.var(axis=0, unbiased=False)
    else:
        mean = var = paddle.zeros(values.shape[1:], dtype="float64")
    if not is_distributed() or (group is not None and group.nranks == 1):
        return count.squeeze(), mean, var
    local = paddle.stack([count.expand(mean.shape), mean, var])  # [3, D]
    gathered = []
    dist.all_gather(gathered, local, group=group)
    stats = paddle.stack(gathered)  # [ranks, 3, D]
    copies = copies_of_each_batch() if group is None else 1
    return combine_moments(stats[:, 0, 0] / copies, stats[:, 1], stats[:, 2])


class Normalizer(nn.Layer):
    """Base normalizer over the last axis (`score_dim`). Buffers: mean [D], var [D], count [1] (float32).

    Before any update, mean is 0 and var is 1, so `normalize` is (nearly) the identity.
    Subclasses define `_merge(count, mean, var)`, returning the new (mean, var) from the batch moments.
    """

    def __init__(self, shape):
        super().__init__()
        shape = [shape] if isinstance(shape, int) else list(shape)
        self.register_buffer("mean", paddle.zeros(shape, dtype="float32"), persistable=True)
        self.register_buffer("var", paddle.ones(shape, dtype="float32"), persistable=True)
        self.register_buffer("count", paddle.zeros([1], dtype="float32"), persistable=True)

    @paddle.no_grad()
    def update(self, values, group=None):
        """Fold a batch `values` [N, D] (any leading shape, flattened) into the running statistics: every data
        rank's batch, or `group`'s (batch_moments)."""
        values = values.detach().reshape([-1, self.mean.shape[-1]])
        count, mean, var = batch_moments(values, group)
        if float(count) == 0:
            return
        new_mean, new_var = self._merge(count, mean, var)
        # Merge in float64, store in float32.
        paddle.assign(new_mean.astype("float32"), output=self.mean)
        paddle.assign(new_var.astype("float32"), output=self.var)
        paddle.assign((self.count.astype("float64") + count).astype("float32").reshape([1]), output=self.count)

    def _merge(self, count, mean, var):
        raise NotImplementedError

    def normalize(self, values, epsilon=1e-5):
        """(values - mean) / sqrt(var + epsilon), broadcast over the last axis; same shape as `values`."""
        mean = self.mean.astype(values.dtype)
        var = self.var.astype(values.dtype)
        return (values - mean) / paddle.sqrt(var + epsilon)


class RunningMeanStd(Normalizer):
    """Exact running mean/var of every value seen so far (equal to NumPy's on their concatenation)."""

    def _merge(self, count, mean, var):
        old_count = self.count.astype("float64").squeeze()
        counts = paddle.stack([old_count, count])
        means = paddle.stack([self.mean.astype("float64"), mean])
        variances = paddle.stack([self.var.astype("float64"), var])
        _, new_mean, new_var = combine_moments(counts, means, variances)
        return new_mean, new_var


class ExponentialMovingAverage(Normalizer):
    """mean <- momentum * mean + (1 - momentum) * batch_mean; var likewise with the batch (population) var.

    The first update (count == 0) sets mean and var to the batch statistics, so the initial 0/1 do not
    bias the average. `count` accumulates the number of values seen.
    """

    def __init__(self, shape, momentum=0.9):
        super().__init__(shape)
        self.momentum = momentum

    def _merge(self, count, mean, var):
        if float(self.count) == 0:
            return mean, var
        m = self.momentum
        return m * self.mean.astype("float64") + (1 - m) * mean, m * self.var.astype("float64") + (1 - m) * var


class IdentityNormalizer(Normalizer):
    """Leaves values unchanged; `update` only counts them."""

    def _merge(self, count, mean, var):
        return self.mean, self.var

    def normalize(self, values, epsilon=1e-5):
        return values


NORMALIZERS = {
    "RunningMeanStd": RunningMeanStd,
    "ExponentialMovingAverage": ExponentialMovingAverage,
    "identity": IdentityNormalizer,
}


def build_normalizer(normalizer_type, score_dim, momentum=0.9):
    """Normalizer named `normalizer_type` (None means "identity") over `score_dim` values."""
    if normalizer_type is None:
        normalizer_type = "identity"
    if normalizer_type not in NORMALIZERS:
        raise ValueError(f"unknown normalizer_type {normalizer_type!r}; choose one of {sorted(NORMALIZERS)} or None")
    if normalizer_type == "ExponentialMovingAverage":
        return ExponentialMovingAverage(score_dim, momentum=momentum)
    return NORMALIZERS[normalizer_type](score_dim)
