"""Adjustments of the scalar rewards before advantages are computed."""

import paddle


def overlong_penalty(response_lengths, max_dec_len, buffer, factor):
    """DAPO's soft overlong punishment: 0 up to max_dec_len - buffer tokens, then falling linearly to
    -factor at max_dec_len. `response_lengths` [B] -> penalties [B] (<= 0)."""
    excess = (response_lengths.astype("float32") - (max_dec_len - buffer)).clip(min=0.0)
    return -factor * paddle.minimum(excess / buffer, paddle.ones_like(excess))
