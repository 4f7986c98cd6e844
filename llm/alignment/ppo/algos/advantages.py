"""Advantage estimators. Each returns token-level advantages [B, R], zero outside the response mask."""

import paddle

from llm.alignment.ppo.algos.registry import ADVANTAGE_ESTIMATORS


def group_mean_std(values, group_index):
    """Per-sample mean and unbiased std of `values` [B] over the samples sharing its `group_index` [B]."""
    _, inverse = paddle.unique(group_index, return_inverse=True)
    one_hot = paddle.nn.functional.one_hot(inverse.reshape([-1]), num_classes=int(inverse.max()) + 1).astype(values.dtype)
    counts = one_hot.sum(axis=0)
    means = (one_hot * values.unsqueeze(-1)).sum(axis=0) / counts
    squared_dev = one_hot * (values.unsqueeze(-1) - means.unsqueeze(0)) ** 2
    stds = paddle.sqrt(squared_dev.sum(axis=0) / (counts - 1.0).clip(min=1.0))
    return one_hot @ means, one_hot @ stds


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards, response_mask, group_index, norm_adv_by_std=True, epsilon=1e-6):
    """Group-relative advantages: (r - mean_group) / (std_group + eps), broadcast over the response.

    With `norm_adv_by_std=False` the std division is dropped (Dr.GRPO), so groups with nearly equal
    rewards are not amplified.
    """
    mean, std = group_mean_std(rewards, group_index)
    scores = rewards - mean
    if norm_adv_by_std:
        scores = scores / (std + epsilon)
    return scores.unsqueeze(-1) * response_mask.astype(rewards.dtype)
