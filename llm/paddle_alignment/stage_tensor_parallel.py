"""fleet's tensor-parallel layers inside pipeline stages: paddlenlp's pipes built at tensor_parallel_degree > 1
(VocabParallelEmbedding, ColumnParallelLinear, RowParallelLinear, the vocabulary-split LM head), their weights
cut from a whole model and gathered back into one.

A stage's split weight is a contiguous block of the whole one along one axis (columns of q/k/v, gate and up
and of the LM head, rows of o, down and the embedding), block `r` on tensor-parallel rank `r`, so the axis is
the one whose length differs between the part and the whole (`split_axis`). Fused q/k/v or gate/up, which
paddlenlp splits by head, are refused by `check_splittable`.

On CPU the layers' three collectives run on the "calc stream", which gloo's process group does not implement
(c_identity, all_reduce_on_calc_stream, c_concat); `bridge_mp_ops_to_gloo` replaces them with the same
forward and backward over gloo's plain all-reduce and all-gather. On GPUs fleet's ops run unchanged.
"""

import weakref

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer
from paddle.distributed import collective as paddle_collective
from paddle.distributed.fleet.layers.mpu import mp_ops

from paddle_alignment.distributed import collective, tensor_parallel_group


class CopyToTensorParallelRegion(PyLayer):
    """fleet's c_identity: the input as it is; its gradient summed over the tensor-parallel group."""

    @staticmethod
    def forward(ctx, tensor, group, skip_c_identity_dynamic):
        ctx.group = group
        return tensor if skip_c_identity_dynamic else tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad


class SumOverTensorParallelRegion(PyLayer):
    """fleet's mp_allreduce: the partial results of a row-split layer summed; the gradient as it is."""

    @staticmethod
    def forward(ctx, tensor, group, use_calc_stream, use_model_parallel, op, skip_c_identity_dynamic):
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherLastAxis(PyLayer):
    """fleet's c_concat: the ranks' column blocks side by side; the gradient of this rank's block."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.rank, ctx.width = group.rank, tensor.shape[-1]
        parts = []
        dist.all_gather(parts, tensor, group=group)
        return paddle.concat(parts, axis=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width]


def gather_last_axis(tensor, group=None):
    return GatherLastAxis.apply(tensor, group or paddle_collective._get_default_group())


def bridge_mp_ops_to_gloo():
    """Make fleet's tensor-parallel layers run between CPU processes (see the module docstring); idempotent.
    paddle.distributed.collective holds its own reference to c_concat, which paddlenlp's LM heads call."""
    mp_ops.c_identity_eager = CopyToTensorParallelRegion
    mp_ops.mp_allreduce_eager = SumOverTensorParallelRegion
    mp_ops._c_concat = paddle_collective._c_concat = gather_last_axis


def split_axis(part_shape, whole_shape):
    """The axis along which a stage's weight of `part_shape` is a block of the whole `whole_shape`, or None when
    it is whole."""
    differing = [axis for axis, (part, full) in enumerate(zip(part_shape, whole_shape)) if part != full]
    if len(differing) > 1 or len(part_shape) != len(whole_shape):
        raise ValueError(f"a stage's weight of shape {list(part_shape)} is no block of the whole {list(whole_shape)}")
    return differing[0] if differing else None


# {pipe: {parameter name: the axis fleet split it along}} for the weights a stage holds in blocks.
SPLIT_AXES = weakref.WeakKeyDictionary()


def stage_weights_from_whole(pipe, whole_state):
    """{name: value} for every weight of `pipe` from the whole model's `whole_state`: this tensor-parallel
    rank's block where fleet splits the weight, the whole value elsewhere. Records the split axes."""
    group, values, axes = tensor_parallel_group(), {}, {}
    for name, part in pipe.state_dict().items():
        full = whole_state[name]
        axis = split_axis(part.shape, full.shape)
        if axis is None:
            values[name] = full
        else:
            width = part.shape[axis]
            values[name] = paddle.slice(full, [axis], [group.rank * width], [(group.rank + 1) * width])
            axes[name] = axis
    SPLIT_AXES[pipe] = axes
    return values


def split_weight_names(pipe):
    """{name: axis} of the stage's weights fleet splits (none without tensor parallel)."""
    return SPLIT_AXES.get(pipe, {})


@paddle.no_grad()
def gathered_weights(pipe, names):
    """{name: whole value} of the stage's weights `names` that fleet splits, gathered over the tensor-parallel
    group (every rank of it calls this)."""
    axes, state, group = split_weight_names(pipe), pipe.state_dict(), tensor_parallel_group()
    gathered = {}
    for name in names:
        parts = []
        with collective("the gather of a pipeline stage's tensor-parallel weights"):
            dist.all_gather(parts, state[name], group=group)
        gathered[name] = paddle.concat(parts, axis=axes[name])
    return gathered
