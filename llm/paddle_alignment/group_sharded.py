"""Training under sharding stages 2 and 3 (paddle's group_sharded_parallel, levels os_g and p_g_os).

Stage 2 reduces each gradient to the rank that owns its parameter during the backward and frees it on the
others; its optimizer step then scales the owned gradients. Stage 3 keeps each large parameter's gradient
only as a slice (`bw_storage`), and the small parameters it leaves whole (`unslice`, at most `segment_size`
elements) keep their rank's own gradients until its step averages them. Either way, before the step no
rank's `parameter.grad` holds the batch's gradient: its norm only exists inside the step, where the stage
hands its clip this rank's part (owned gradients, slices, and the averaged whole ones). `MeasuredClip`
sits there, as the optimizer's clip. Both stages replace the optimizer's `clear_grad` by one without
arguments.

Stage 3 also holds the weights themselves in slices, gathered from every rank of its group in each layer's
forward: every rank must run as many forwards as the others (`forwards_in_lockstep`), and a save first
gathers the whole weights (`gather_whole_weights`).
"""

import math

import paddle
import paddle.distributed as dist
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3

from paddle_alignment.distributed import collective, holds_sliced_weights
from paddle_alignment.fused_optimizer import gradient_square_sum


class MeasuredClip:
    """The clip of a stage-2 or stage-3 optimizer: measures the global norm of the gradients it is handed
    (this rank's part, summed over the sharding group, plus the whole ones stage 3 averaged) in `norm`, then
    runs the stage's own clip, if the optimizer had one."""

    def __init__(self, clip, group):
        self.clip, self.group, self.norm = clip, group, None

    @paddle.no_grad()
    def __call__(self, params_grads):
        parts = [g for p, g in params_grads if g is not None and not getattr(p, "unslice", False)]
        whole = [g for p, g in params_grads if g is not None and getattr(p, "unslice", False)]
        squares = paddle.to_tensor(gradient_square_sum(parts), dtype="float64")
        dist.all_reduce(squares, group=self.group)
        self.norm = math.sqrt(float(squares) + gradient_square_sum(whole))
        return params_grads if self.clip is None else self.clip(params_grads)

    def __getattr__(self, name):  # the stage's clip's settings (clip_norm, ...), as its own wrapper forwards them
        return getattr(self.clip, name)


def stepping_optimizer(optimizer):
    """The optimizer that steps and holds the states: the one sharding stage 2's wraps (`_optim`; stage 3 sets
    `_optim` to the optimizer itself), else `optimizer`."""
    return getattr(optimizer, "_optim", optimizer)


def clipping_optimizer(optimizer):
    """The optimizer whose clip a group-sharded step runs: the stepping one or, with master gradients
    (amp_master_grad), the one inside that mixed-precision one."""
    inner = stepping_optimizer(optimizer)
    return getattr(inner, "_inner_opt", inner)


def measure_gradient_norm(model_wrapped, optimizer):
    """Under stage 2 or 3 (`model_wrapped` a GroupShardedStage2 or 3), make `optimizer`'s clip a MeasuredClip."""
    if isinstance(model_wrapped, (GroupShardedStage2, GroupShardedStage3)):
        holder = clipping_optimizer(optimizer)
        holder._grad_clip = MeasuredClip(holder._grad_clip, model_wrapped._group)


def measured_clip(optimizer):
    """The MeasuredClip of `optimizer`, or None when it is not a stage-2 or stage-3 optimizer."""
    clip = getattr(clipping_optimizer(optimizer), "_grad_clip", None)
    return clip if isinstance(clip, MeasuredClip) else None


def gather_whole_weights(*wrapped_models):
    """Before a save (every rank calls it): each stage-3 model's parameters whole, on the CPU, until its next
    forward gathers them again (paddlenlp's Trainer saves stage 3 the same way)."""
    for wrapped in wrapped_models:
        if isinstance(wrapped, GroupShardedStage3):
            with collective("sharding stage 3's gathering of whole weights to save"):
                wrapped.get_all_parameters(convert2cpu=True)


def forwards_in_lockstep(model):
    """Whether every rank must run as many forwards of `model` as the others: stage 3 gathers each sliced weight
    from every rank of its group in the forward of the weight's layer."""
    return holds_sliced_weights(model)
