"""NumPy references of the rollout ops (csrc/rollout_ops.cc, csrc/gpu/rollout_kernels.cuh): the semantics
csrc/README.md documents, written plainly. The CPU ops' tests (tests/csrc/test_rollout_ops.py) and the CUDA
kernels' check (csrc/gpu/check_kernels.py) both compare against these."""

import numpy as np

MASK64 = (1 << 64) - 1
NO_TOKEN = -1  # rollout_sample's token for a row with nothing to sample from


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform01(seed, row, step):
    bits = mix64(mix64(mix64(seed) ^ row) ^ step)
    return (bits >> 11) * (1.0 / 9007199254740992.0)


def reference_penalty(logits, history, step_idx, repetition, frequency, presence, min_len, eos_ids, banned):
    """Ids outside [0, V) (a history's padding, say) are passed over, in the history, the end ids and the bans."""
    out = logits.copy()
    vocab = out.shape[1]

    def inside(ids):
        ids = np.asarray(ids)
        return ids[(ids >= 0) & (ids < vocab)]

    for b in range(out.shape[0]):
        tokens, counts = np.unique(inside(history[b, : step_idx[b]]), return_counts=True)
        for token, count in zip(tokens, counts):
            value = out[b, token]
            value = value / repetition[b] if value > 0 else value * repetition[b]
            out[b, token] = value - count * frequency[b] - presence[b]
        if step_idx[b] < min_len[b]:
            out[b, inside(eos_ids)] = -np.inf
        out[b, inside(banned)] = -np.inf
    return out


def reference_keep_mask(logits_row, temperature, top_k, top_p):
    """The tokens kept by top-k then top-p (ties at the boundary kept), and their probabilities."""
    scaled = logits_row.astype(np.float32) / np.float32(temperature)
    probs = np.exp(scaled - scaled.max()).astype(np.float32)
    ordered = np.sort(probs)[::-1]
    threshold = ordered[top_k - 1] if 0 < top_k < len(probs) else 0.0
    if top_p < 1.0:
        kept = ordered[ordered >= threshold].astype(np.float64)
        cumulative = np.cumsum(kept)  # sequential sums, as the kernels add
        crossing = np.searchsorted(cumulative, np.float32(top_p) * cumulative[-1])
        if crossing < len(kept):
            threshold = max(threshold, kept[crossing])
    return (probs >= threshold) & (probs > 0), probs


def reference_sample(logits, temperature, top_k, top_p, step_idx, seed, row_ids=None):
    row_ids = range(len(logits)) if row_ids is None else row_ids
    tokens = []
    for b, row in enumerate(logits):
        if np.isnan(row).any() or not np.isfinite(row.max()):  # a NaN or +inf logit, or all -inf
            tokens.append(NO_TOKEN)
            continue
        if temperature[b] <= 0 or top_k[b] == 1:
            tokens.append(int(np.argmax(row)))
            continue
        keep, probs = reference_keep_mask(row, temperature[b], top_k[b], top_p[b])
        mass = np.where(keep, probs, 0.0).astype(np.float64)
        cumulative = np.cumsum(mass)
        target = uniform01(seed, int(row_ids[b]), int(step_idx[b])) * cumulative[-1]
        above = np.nonzero((cumulative > target) & keep)[0]
        tokens.append(int(above[0]) if len(above) else int(np.nonzero(keep)[0][-1]))
    return np.array(tokens)


def bookkeeping_batch(rng, rows, history_len):
    """Random inputs of rollout_save_step and rollout_update_stop: (history, step_idx (some past the history),
    tokens, stop_flags (about 30% set), eos_ids)."""
    history = rng.integers(0, 50, size=(rows, history_len))
    step_idx, tokens = rng.integers(0, history_len + 2, size=rows), rng.integers(0, 20, size=rows)
    return history, step_idx, tokens, rng.random(rows) < 0.3, np.array([3, 11])


def reference_save_step(history, step_idx, tokens, stop_flags):
    """(history, step_idx) after rollout_save_step: each running row whose history has room writes its token."""
    history, step_idx = history.copy(), step_idx.copy()
    for b in range(len(tokens)):
        if not stop_flags[b] and step_idx[b] < history.shape[1]:
            history[b, step_idx[b]] = tokens[b]
            step_idx[b] += 1
    return history, step_idx


def reference_update_stop(tokens, stop_flags, step_idx, eos_ids, max_dec_len, pad_id):
    """(tokens, stop_flags, any row still running) after rollout_update_stop."""
    tokens = np.where(stop_flags, pad_id, tokens)
    stop_flags = stop_flags | np.isin(tokens, eos_ids) | (step_idx >= max_dec_len)
    return tokens, stop_flags, bool((~stop_flags).any())
