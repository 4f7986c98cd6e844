"""Advantage estimators. Each returns token-level advantages [B, R], zero outside the response mask."""

import paddle

from llm.alignment.ppo.algos.registry import ADVANTAGE_ESTIMATORS


def group_one_hot(group_index, dtype):
    """[B, G] membership of each sample in its prompt group (groups numbered in sorted order)."""
    _, inverse = paddle.unique(group_index, return_inverse=True)
    return paddle.nn.functional.one_hot(inverse.reshape([-1]), num_classes=int(inverse.max()) + 1).astype(dtype)


def group_mean_std(values, group_index):
    """Per-sample mean and unbiased std of `values` [B] over the samples sharing its `group_index` [B]."""
    one_hot = group_one_hot(group_index, values.dtype)
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


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards, response_mask, group_index):
    """REINFORCE leave-one-out: r_i minus the mean reward of the other samples of its prompt,
    n / (n - 1) * (r_i - mean_group), broadcast over the response."""
    one_hot = group_one_hot(group_index, rewards.dtype)
    counts = one_hot @ one_hot.sum(axis=0)
    mean, _ = group_mean_std(rewards, group_index)
    scores = counts / (counts - 1.0).clip(min=1.0) * (rewards - mean)
    return scores.unsqueeze(-1) * response_mask.astype(rewards.dtype)
