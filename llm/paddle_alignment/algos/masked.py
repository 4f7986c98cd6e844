"""Sums, means and whitening over the valid positions of a mask: the one implementation that losses,
advantages and metrics share.

`masked_whiten` takes `reduce_sum`, a function summing a tensor over the data-parallel ranks, so the
statistics can be those of the global batch (as verl whitens the whole batch) without this module
knowing about communication.
"""

import paddle


def masked_sum(values, mask, axis=None):
    return (values * mask.astype(values.dtype)).sum(axis=axis)


def masked_mean(values, mask, axis=None):
    return masked_sum(values, mask, axis) / mask.astype(values.dtype).sum(axis=axis).clip(min=1.0)


def masked_whiten(values, mask, reduce_sum=None, epsilon=1e-8):
    """(values - mean) / sqrt(var + epsilon) over the positions where `mask` is 1, 0 elsewhere; the variance
    is unbiased (Bessel's correction, as verl's `masked_whiten`). With `reduce_sum` the mean and variance
    are taken over every rank's valid positions."""
    reduce_sum = reduce_sum or (lambda tensor: tensor)
    mask = mask.astype(values.dtype)
    count, total = reduce_sum(paddle.stack([mask.sum(), masked_sum(values, mask)]))
    mean = total / count.clip(min=1.0)
    squares = reduce_sum(masked_sum((values - mean) ** 2, mask).reshape([1]))[0]
    variance = squares / (count - 1.0).clip(min=1.0)
    return (values - mean) * paddle.rsqrt(variance + epsilon) * mask
