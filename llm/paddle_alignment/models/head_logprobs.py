"""Log-probs and entropies of the response tokens straight from the last hidden states and the LM head, a
chunk of tokens at a time, forward and backward.

With Qwen2.5's 151,936-entry vocabulary the logits of one micro-batch of 4 x 2,048 response tokens are 5 GB
in float32, and the log-softmax, its gradient and the casts around it hold several such copies: the memory
of an RL step would grow with the vocabulary times the batch. Here the LM head projects `chunk_tokens`
positions at a time, each chunk's log-probs and entropies are taken from its logits (`token_logprobs_and_entropy`,
fused on the CPU) and the logits are dropped; the backward projects each chunk again and takes its
gradients from it. At most one chunk's [chunk_tokens, V] float32 logits (and their gradient) are alive, and
the results equal the whole-logits computation (same formulas, same order within a token).

The gradient of the head's weight is summed over the chunks, so the head's [V, H] gradient exists once plus
one chunk's share while it is added; the hidden states' gradient comes chunk by chunk. Under tensor parallel
the weight and hidden states are distributed tensors: a head split over the vocabulary gives each rank its
part of each chunk's logits, Paddle's engine reduces the softmax over the ranks, and each chunk's
hidden-state gradient is summed over them (reduced_partials). Paddle cannot take
`paddle.grad` through this layer (a backward inside a backward): `loss.backward()` only, as the trainer does.
"""

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer
from paddle.base import core

from paddle_alignment.models.fused_kernels import token_logprobs_and_entropy
from paddle_alignment.models.tensor_parallel import is_dist_tensor, whole

DEFAULT_CHUNK_TOKENS = 512


def head_logits(hidden, weight, transpose):
    """hidden [N, H] through the head: weight [H, V], or [V, H] with `transpose` (tied to the embedding)."""
    if weight.dtype != hidden.dtype:  # autocast runs the head in the activations' precision
        weight = weight.astype(hidden.dtype)
    return paddle.matmul(hidden, weight, transpose_y=transpose)


def autocast_state():
    """paddle.amp.auto_cast's arguments for the autocast in force, which a PyLayer's backward runs outside of:
    its recompute enters them again to compute as its forward did (as Paddle's recompute does). Under O1 the
    head's product would otherwise run in float32 in the backward, and in bfloat16 in the forward."""
    tracer = paddle.base.framework._dygraph_tracer()
    white, black = tracer._get_amp_op_list()
    return {
        "enable": tracer._amp_level != core.AmpLevel.O0, "custom_white_list": white, "custom_black_list": black,
        "level": "O2" if tracer._amp_level == core.AmpLevel.O2 else "O1",
        "dtype": "float16" if tracer._amp_dtype == "float16" else "bfloat16",
    }


def chunk_bounds(tokens, chunk_tokens):
    return [(start, min(start + chunk_tokens, tokens)) for start in range(0, tokens, chunk_tokens)]


class ChunkedHeadStats(PyLayer):
    """(log-probs [N], entropies [N]) of labels [N] under softmax(hidden [N, H] @ head / temperature), one
    chunk of positions at a time (see the module's docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, transpose, temperature, chunk_tokens):
        ctx.save_for_backward(hidden, weight, labels)
        ctx.options = (transpose, temperature, chunk_tokens)
        ctx.autocast = autocast_state()
        logprobs, entropies = [], []
        with paddle.no_grad():
            for start, end in chunk_bounds(hidden.shape[0], chunk_tokens):
                logits = head_logits(hidden[start:end], weight, transpose)
                chunk_logprobs, chunk_entropy = token_logprobs_and_entropy(logits, labels[start:end], temperature)
                logprobs.append(chunk_logprobs)
                entropies.append(chunk_entropy)
        return paddle.concat(logprobs), paddle.concat(entropies)

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, labels = ctx.saved_tensor()
        transpose, temperature, chunk_tokens = ctx.options
        # Detached leaves: each chunk's backward leaves its gradient in chunk.grad and adds its share to head.grad.
        head = weight.detach()
        head.stop_gradient = weight.stop_gradient
        grad_hidden = []
        for start, end in chunk_bounds(hidden.shape[0], chunk_tokens):
            chunk = hidden[start:end].detach()
            chunk.stop_gradient = False
            with paddle.enable_grad(), paddle.amp.auto_cast(**ctx.autocast):
                outputs = token_logprobs_and_entropy(head_logits(chunk, head, transpose), labels[start:end], temperature)
            seeds = [(out, grad[start:end]) for out, grad in zip(outputs, (grad_logprobs, grad_entropy)) if grad is not None]
            paddle.autograd.backward([out for out, _ in seeds], [grad for _, grad in seeds])
            grad_hidden.append(reduced_partials(chunk.grad))
        return paddle.concat(grad_hidden), None if weight.stop_gradient else head.grad


def reduced_partials(tensor):
    """`tensor` with its partial placements reduced over their ranks. A head split over the vocabulary by tensor
    parallel leaves each rank a partial sum of the hidden states' gradient, which Paddle (3.3) would take from
    the backward as a value of the hidden states' own placement without reducing it (measured: each rank's
    gradient was its own part)."""
    if not is_dist_tensor(tensor) or not any(p.is_partial() for p in tensor.placements):
        return tensor
    return dist.reshard(tensor, tensor.process_mesh, [dist.Replicate() if p.is_partial() else p for p in tensor.placements])


def head_token_stats(hidden, weight, transpose, labels, temperature=1.0, chunk_tokens=DEFAULT_CHUNK_TOKENS):
    """log p(labels) and the entropy of softmax(hidden @ head / temperature), float32: hidden [B, R, H],
    labels [B, R] -> ([B, R], [B, R]). `weight`/`transpose` as head_logits. Up to `chunk_tokens` positions
    (0: all) take one whole-logits pass; more go chunk by chunk (ChunkedHeadStats)."""
    batch, length, width = hidden.shape
    tokens = batch * length
    if chunk_tokens <= 0 or tokens <= chunk_tokens:
        return token_logprobs_and_entropy(head_logits(hidden, weight, transpose), labels, temperature)
    flat_labels = labels.reshape([tokens]).astype("int64")
    logprobs, entropy = ChunkedHeadStats.apply(
        hidden.reshape([tokens, width]), weight, flat_labels, transpose, float(temperature), int(chunk_tokens)
    )
    return logprobs.reshape([batch, length]), entropy.reshape([batch, length])


@paddle.no_grad()
def head_topk_logprobs(hidden, weight, transpose, labels, k, temperature=1.0, chunk_tokens=DEFAULT_CHUNK_TOKENS):
    """(log p(labels) [B, R], the k largest log-probs [B, R, k] and their token ids [B, R, k]) of
    softmax(hidden @ head / temperature), float32, no gradient: a teacher's distribution at each position without
    its whole [B, R, V] logits, `chunk_tokens` positions at a time (0: all)."""
    batch, length, width = hidden.shape
    flat, flat_labels = hidden.reshape([batch * length, width]), labels.reshape([batch * length])
    parts = [
        topk_logprobs(head_logits(flat[start:end], weight, transpose), flat_labels[start:end], k, temperature)
        for start, end in chunk_bounds(flat.shape[0], chunk_tokens if chunk_tokens > 0 else flat.shape[0])
    ]
    label_logprobs, top, ids = (paddle.concat(column) for column in zip(*parts))
    return label_logprobs.reshape([batch, length]), top.reshape([batch, length, -1]), ids.reshape([batch, length, -1])


@paddle.no_grad()
def topk_logprobs(logits, labels, k, temperature=1.0):
    """(log p(labels) [...], the k largest log-probs [..., k], their ids [..., k]) of softmax(logits [..., V] /
    temperature), float32; k at least V: the whole distribution, most likely first. The top tokens are the top
    logits, their log-probs from the labels' (logprobs_from_label): no log-softmax over the vocabulary, which
    Paddle's CPU kernel takes minutes for at 151,936 entries."""
    logits = whole(logits)
    label_logprobs = token_logprobs_and_entropy(logits, labels, temperature)[0]
    top, ids = paddle.topk(logits, min(k, logits.shape[-1]), axis=-1)
    label_logits = paddle.take_along_axis(logits, labels.unsqueeze(-1).astype("int64"), axis=-1).squeeze(-1)
    return label_logprobs, logprobs_from_label(top, label_logits, label_logprobs, temperature), ids


def logprobs_from_label(token_logits, label_logits, label_logprobs, temperature=1.0):
    """log p of the tokens whose logits are `token_logits` [..., K] under softmax(logits / temperature), given one
    token's logit `label_logits` [...] and log-prob `label_logprobs` [...] under the same softmax: the
    log-partition is label_logit / temperature - log p(label), so no pass over the vocabulary is needed.
    Differentiable in all three."""
    log_partition = label_logits.astype("float32") / temperature - label_logprobs
    return token_logits.astype("float32") / temperature - log_partition.unsqueeze(-1)


def head_rows(weight, transpose, ids):
    """The head's weight vectors of the token `ids` [...]: [..., H] (weight [H, V], or [V, H] with `transpose`)."""
    flat = ids.reshape([-1])
    rows = paddle.gather(weight, flat, axis=0) if transpose else paddle.gather(weight, flat, axis=1).T
    return rows.reshape([*ids.shape, rows.shape[-1]])


def logprobs_at(hidden, weight, transpose, labels, label_logprobs, ids, temperature=1.0):
    """log p(ids) [B, R, K] under softmax(hidden @ head / temperature), with gradients, given log p(labels) [B, R]
    as head_token_stats took them (with theirs): only the K + 1 tokens' logits are computed at each position
    (logprobs_from_label), never the vocabulary's; K + 1 head rows of H values per position are held for the
    backward."""
    rows = head_rows(weight, transpose, paddle.concat([labels.unsqueeze(-1).astype(ids.dtype), ids], axis=-1))
    if rows.dtype != hidden.dtype:
        rows = rows.astype(hidden.dtype)
    logits = paddle.matmul(rows, hidden.unsqueeze(-1)).squeeze(-1)  # [B, R, K + 1]
    return logprobs_from_label(logits[:, :, 1:], logits[:, :, 0], label_logprobs, temperature)
