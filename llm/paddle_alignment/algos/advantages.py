"""Advantage estimators. Each returns token-level advantages [B, R], zero outside the response mask;
an estimator that trains a critic (`ppo`) returns (advantages, returns), the returns being the critic's targets.

An estimator's parameters are named after what fills them (`AdvantageEstimation`): the batch's tensors
(rewards, response_mask, group_index, values, logprobs, ref_logprobs, scored), `reduce_sum` (the sum over data ranks),
and its options, named as their config keys (norm_adv_by_std_in_grpo, gamma, ...). A new estimator is a
registered function, and any new option a field of AdvantageEstimation with its config key.

Rows the reward source could not score arrive with their response_mask zeroed (Experience.trained_mask), so
they get no advantage and leave every whitening; `scored` [B] (None when every row was scored) takes them out
of their group's statistics too."""

from dataclasses import asdict, dataclass

import paddle

from paddle_alignment.algos.masked import masked_whiten
from paddle_alignment.algos.registry import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, call_with_options, from_config


@dataclass(frozen=True)
class AdvantageEstimation:
    """The run's advantage estimator (`rl_algorithm`) and the options estimators take, each the config key of
    its name."""

    rl_algorithm: str = "ppo"
    norm_adv_by_std_in_grpo: bool = True
    kl_coeff: float = 0.0
    reward_kl_estimator: str = "k1"
    gamma: float = 1.0
    lam: float = 0.95
    normalize_advantage: bool = False

    @classmethod
    def from_args(cls, args):
        return from_config(cls, args)

    def __call__(self, exp, reduce_sum=None):
        """(advantages, returns: None but for an estimator that trains a critic), [B, R], of the Experience
        `exp` (rewards and what the estimator reads of it); `reduce_sum` sums a statistic over the data ranks."""
        result = call_with_options(
            ADVANTAGE_ESTIMATORS.get(self.rl_algorithm), exp.rewards, exp.trained_mask, group_index=exp.group_index,
            values=exp.values, logprobs=exp.old_logprobs, ref_logprobs=exp.ref_logprobs, reduce_sum=reduce_sum,
            scored=exp.scored, **asdict(self),
        )
        return result if isinstance(result, tuple) else (result, None)


def group_stats(values, group_index, scored=None):
    """Per-sample size, mean and unbiased std of the group of samples sharing its `group_index` [B], over the
    `scored` samples of the group (all when None)."""
    _, inverse = paddle.unique(group_index, return_inverse=True)
    groups = int(inverse.max()) + 1
    one_hot = paddle.nn.functional.one_hot(inverse.reshape([-1]), num_classes=groups).astype(values.dtype)
    members = one_hot if scored is None else one_hot * scored.astype(values.dtype).unsqueeze(-1)
    counts = members.sum(axis=0)
    means = (members * values.unsqueeze(-1)).sum(axis=0) / counts.clip(min=1.0)
    squared_dev = members * (values.unsqueeze(-1) - means.unsqueeze(0)) ** 2
    stds = paddle.sqrt(squared_dev.sum(axis=0) / (counts - 1.0).clip(min=1.0))
    return one_hot @ counts, one_hot @ means, one_hot @ stds


@ADVANTAGE_ESTIMATORS.register("grpo", group_baseline=True)
def grpo_advantages(rewards, response_mask, group_index, norm_adv_by_std_in_grpo=True, epsilon=1e-6, scored=None):
    """Group-relative advantages: (r - mean_group) / (std_group + eps), broadcast over the response.

    With `norm_adv_by_std_in_grpo=False` the std division is dropped (Dr.GRPO), so groups with nearly equal
    rewards are not amplified.
    """
    _, mean, std = group_stats(rewards, group_index, scored)
    scores = rewards - mean
    if norm_adv_by_std_in_grpo:
        scores = scores / (std + epsilon)
    return scores.unsqueeze(-1) * response_mask.astype(rewards.dtype)


@ADVANTAGE_ESTIMATORS.register("rloo", group_baseline=True)
def rloo_advantages(rewards, response_mask, group_index, scored=None):
    """REINFORCE leave-one-out: r_i minus the mean reward of the other samples of its prompt,
    n / (n - 1) * (r_i - mean_group), broadcast over the response."""
    counts, mean, _ = group_stats(rewards, group_index, scored)
    scores = counts / (counts - 1.0).clip(min=1.0) * (rewards - mean)
    return scores.unsqueeze(-1) * response_mask.astype(rewards.dtype)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline", group_baseline=True)
def reinforce_plus_plus_baseline_advantages(rewards, response_mask, group_index, reduce_sum=None, scored=None):
    """REINFORCE++-baseline: r minus the mean reward of its prompt's group, broadcast over the response and
    whitened over every valid token of the batch (of every rank, with `reduce_sum`), as verl's
    reinforce_plus_plus_baseline. The KL to the reference goes in the loss (kl_loss_coeff), not the reward."""
    _, mean, _ = group_stats(rewards, group_index, scored)
    scores = (rewards - mean).unsqueeze(-1) * response_mask.astype(rewards.dtype)
    return masked_whiten(scores, response_mask, reduce_sum)


def last_token_rewards(rewards, response_mask):
    """Scalar rewards [B] placed on the last sampled token (the last position the mask keeps, wherever masked
    observation spans sit before it): [B, R]."""
    mask = response_mask.astype(rewards.dtype)
    positions = paddle.arange(mask.shape[1], dtype=rewards.dtype)
    last = (positions * mask).max(axis=-1).astype("int64")
    return paddle.nn.functional.one_hot(last, num_classes=mask.shape[1]).astype(rewards.dtype) * rewards.unsqueeze(-1) * mask


def carried(mask_t, new, old):
    """`new` where position t is a sampled token, else `old` unchanged: the backward recursions below step over
    masked positions (tool observations inside a trajectory, padding after it) instead of restarting there."""
    return mask_t * new + (1.0 - mask_t) * old


def discounted_returns(token_rewards, response_mask, gamma):
    """G_t = sum over sampled tokens k >= t of gamma^(their count between t and k) r_k: [B, R], 0 at masked
    positions."""
    mask = response_mask.astype(token_rewards.dtype)
    running = paddle.zeros_like(token_rewards[:, 0])
    returns = []
    for t in reversed(range(token_rewards.shape[1])):
        running = carried(mask[:, t], token_rewards[:, t] + gamma * running, running)
        returns.append(running)
    return paddle.stack(returns[::-1], axis=1) * mask


def kl_shaped_token_rewards(
    rewards, response_mask, logprobs=None, ref_logprobs=None, kl_coeff=0.0, reward_kl_estimator="k1"
):
    """Token rewards of PPO and REINFORCE++: -kl_coeff * KL_t on every token (`reward_kl_estimator`, an estimator
    of kl.py, of the rollout policy's `logprobs` against the reference's: k1 as verl's and PaddleNLP's default)
    plus the scalar reward on the last one: [B, R]."""
    token_rewards = last_token_rewards(rewards, response_mask)
    if kl_coeff:
        token_kl = KL_ESTIMATORS.get(reward_kl_estimator)(logprobs, ref_logprobs)
        token_rewards = token_rewards - kl_coeff * token_kl * response_mask.astype(rewards.dtype)
    return token_rewards


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus", kl_in_reward=True)
def reinforce_plus_plus_advantages(
    rewards, response_mask, logprobs=None, ref_logprobs=None, kl_coeff=0.0, gamma=1.0, reduce_sum=None,
    reward_kl_estimator="k1",
):
    """REINFORCE++: discounted returns of the KL-shaped token rewards, whitened over every valid token of
    the batch (of every rank, with `reduce_sum`: see masked_whiten). No per-prompt baseline."""
    token_rewards = kl_shaped_token_rewards(
        rewards, response_mask, logprobs, ref_logprobs, kl_coeff, reward_kl_estimator
    )
    returns = discounted_returns(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask, reduce_sum)


@ADVANTAGE_ESTIMATORS.register("ppo", critic=True, kl_in_reward=True)
def gae_advantages(
    rewards, response_mask, values, logprobs=None, ref_logprobs=None, kl_coeff=0.0, gamma=1.0, lam=0.95,
    normalize_advantage=True, reduce_sum=None, reward_kl_estimator="k1",
):
    """PPO: generalised advantage estimation on the KL-shaped token rewards with the critic's `values` [B, R].

    delta_t = r_t + gamma * V_{t+1} - V_t (V past the response is 0), A_t = delta_t + gamma * lam * A_{t+1},
    t + 1 the next sampled token (masked observation positions are stepped over); the returns A_t + V_t are the
    critic's targets. With `normalize_advantage` the advantages (not the
    returns) are whitened over the valid tokens (of every rank, with `reduce_sum`). Returns (advantages,
    returns), both [B, R].
    """
    mask = response_mask.astype(rewards.dtype)
    token_rewards = kl_shaped_token_rewards(
        rewards, response_mask, logprobs, ref_logprobs, kl_coeff, reward_kl_estimator
    )
    values = values * mask
    next_value = paddle.zeros_like(values[:, 0])
    running = paddle.zeros_like(values[:, 0])
    advantages = []
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = carried(mask[:, t], delta + gamma * lam * running, running)
        advantages.append(running)
        next_value = carried(mask[:, t], values[:, t], next_value)
    advantages = paddle.stack(advantages[::-1], axis=1) * mask
    returns = (advantages + values) * mask
    if normalize_advantage:
        advantages = masked_whiten(advantages, response_mask, reduce_sum)
    return advantages, returns
