"""Adjustments of the scalar rewards before advantages are computed, and DAPO's group filter."""

import paddle


def overlong_penalty(response_lengths, max_dec_len, buffer, factor):
    """DAPO's soft overlong punishment: 0 up to max_dec_len - buffer tokens, then falling linearly to
    -factor at max_dec_len. `response_lengths` [B] -> penalties [B] (<= 0)."""
    excess = (response_lengths.astype("float32") - (max_dec_len - buffer)).clip(min=0.0)
    return -factor * paddle.minimum(excess / buffer, paddle.ones_like(excess))


def missing_eos_penalty(finished, penalty):
    """-penalty for each response that never emitted EOS (cut at max_dec_len), 0 otherwise: [B]."""
    return -penalty * (~finished).astype("float32")


def groups_with_reward_variance(rewards, group_index, scored=None):
    """DAPO's dynamic-sampling filter: True for the samples whose group's rewards are not all equal [B], among
    its `scored` samples (all when None). Groups of equal rewards have zero advantage under group baselines and
    carry no gradient."""
    same_group = group_index.unsqueeze(0) == group_index.unsqueeze(1)
    differs = same_group & (rewards.unsqueeze(0) != rewards.unsqueeze(1))
    if scored is not None:
        differs = differs & scored.unsqueeze(0) & scored.unsqueeze(1)
    return (same_group & differs.any(axis=1).unsqueeze(0)).any(axis=1)


def shape_rewards(
    scores, finished, response_lengths, missing_eos=0.0, max_dec_len=None, overlong_buffer=0, overlong_factor=0.0,
    normalize=None, clip_range=None,
):
    """The rewards [B] of scores [B], in order: the missing-EOS penalty (`missing_eos` > 0), DAPO's
    overlong penalty (`overlong_buffer` > 0), `normalize` (a function of the rewards, e.g. a running
    mean/std normaliser) and clipping to [-clip_range, clip_range]."""
    rewards = scores
    if missing_eos:
        rewards = rewards + missing_eos_penalty(finished, missing_eos)
    if overlong_buffer:
        rewards = rewards + overlong_penalty(response_lengths, max_dec_len, overlong_buffer, overlong_factor)
    if normalize is not None:
        rewards = normalize(rewards)
    return rewards if clip_range is None else rewards.clip(-clip_range, clip_range)
