"""Advantage estimators. Each returns token-level advantages [B, R], zero outside the response mask."""

import paddle

from llm.alignment.ppo.algos.registry import ADVANTAGE_ESTIMATORS
from llm.alignment.ppo.comm_utils import masked_whiten


def group_stats(values, group_index):
    """Per-sample size, mean and unbiased std of the group of samples sharing its `group_index` [B]."""
    _, inverse = paddle.unique(group_index, return_inverse=True)
    groups = int(inverse.max()) + 1
    one_hot = paddle.nn.functional.one_hot(inverse.reshape([-1]), num_classes=groups).astype(values.dtype)
    counts = one_hot.sum(axis=0)
    means = (one_hot * values.unsqueeze(-1)).sum(axis=0) / counts
    squared_dev = one_hot * (values.unsqueeze(-1) - means.unsqueeze(0)) ** 2
    stds = paddle.sqrt(squared_dev.sum(axis=0) / (counts - 1.0).clip(min=1.0))
    return one_hot @ counts, one_hot @ means, one_hot @ stds


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards, response_mask, group_index, norm_adv_by_std=True, epsilon=1e-6):
    """Group-relative advantages: (r - mean_group) / (std_group + eps), broadcast over the response.

    With `norm_adv_by_std=False` the std division is dropped (Dr.GRPO), so groups with nearly equal
    rewards are not amplified.
    """
    _, mean, std = group_stats(rewards, group_index)
    scores = rewards - mean
    if norm_adv_by_std:
        scores = scores / (std + epsilon)
    return scores.unsqueeze(-1) * response_mask.astype(rewards.dtype)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards, response_mask, group_index):
    """REINFORCE leave-one-out: r_i minus the mean reward of the other samples of its prompt,
    n / (n - 1) * (r_i - mean_group), broadcast over the response."""
    counts, mean, _ = group_stats(rewards, group_index)
    scores = counts / (counts - 1.0).clip(min=1.0) * (rewards - mean)
    return scores.unsqueeze(-1) * response_mask.astype(rewards.dtype)


def last_token_rewards(rewards, response_mask):
    """Scalar rewards [B] placed on the last valid response token: [B, R]."""
    mask = response_mask.astype(rewards.dtype)
    lengths = mask.sum(axis=-1).astype("int64")
    last = paddle.nn.functional.one_hot((lengths - 1).clip(min=0), num_classes=mask.shape[1]).astype(rewards.dtype)
    return last * rewards.unsqueeze(-1) * mask


def discounted_returns(token_rewards, response_mask, gamma):
    """G_t = sum over k >= t of gamma^(k - t) r_k, within each response: [B, R]."""
    mask = response_mask.astype(token_rewards.dtype)
    running = paddle.zeros_like(token_rewards[:, 0])
    returns = []
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running * mask[:, t]
        returns.append(running)
    return paddle.stack(returns[::-1], axis=1) * mask


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus_advantages(rewards, response_mask, token_kl=None, kl_coeff=0.0, gamma=1.0):
    """REINFORCE++: token rewards -kl_coeff * KL_t (k1, policy vs reference) plus the score on the last
    token, discounted returns, whitened over every valid token of the batch. No per-prompt baseline."""
    token_rewards = last_token_rewards(rewards, response_mask)
    if token_kl is not None and kl_coeff:
        token_rewards = token_rewards - kl_coeff * token_kl * response_mask.astype(rewards.dtype)
    returns = discounted_returns(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask)
