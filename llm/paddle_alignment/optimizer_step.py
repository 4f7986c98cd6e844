"""One optimizer step of a trained model in any of the run's layouts: clip by the global gradient norm, step,
schedule, and return the pre-clip norm of the whole step's gradients (over every rank). Under fleet's hybrid
parallel the gradients are reduced inside fleet's step, so the norm is measured between its two halves; a
group-sharded optimizer measures it in its clip (group_sharded.py); a tensor-parallel model, which
paddle.DataParallel does not wrap, averages its gradients over the data ranks first."""

import paddle
import paddle.distributed as dist
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
    HybridParallelOptimizer,
    obtain_optimizer_parameters_list,
)

from paddle_alignment.distributed import collective
from paddle_alignment.fused_optimizer import gradient_norm
from paddle_alignment.group_sharded import measured_clip
from paddle_alignment.models.tensor_parallel import average_gradients_over_data_ranks, is_tensor_parallel


def step_optimizer(model, optimizer, lr_scheduler):
    """Clip (by the optimizer's global-norm clip), step, schedule; returns the pre-clip norm of the step's
    gradients (of the whole batch, over every rank)."""
    group_sharded = measured_clip(optimizer)
    if isinstance(optimizer, HybridParallelOptimizer):
        with collective("the optimizer step's gradient reduction"):
            grad_norm = hybrid_parallel_step(optimizer)
    elif group_sharded is not None:
        with collective("the group-sharded step's gradient reduction"):
            optimizer.step()
        grad_norm = group_sharded.norm
    else:
        # paddle.DataParallel has averaged the gradients over the data ranks during backward; a
        # tensor-parallel model, which it does not wrap (split_training.py), averages its parts of them now.
        if is_tensor_parallel(model):
            average_gradients_over_data_ranks(model.parameters())
        grad_norm = gradient_norm(model.parameters())
        optimizer.step()
    lr_scheduler.step()
    # Gradients are freed, not zeroed, so an offloaded model leaves no gradient memory on the device
    # (stages 2 and 3 replace clear_grad by one without arguments that frees their gradients).
    optimizer.clear_grad() if group_sharded is not None else optimizer.clear_grad(set_to_zero=False)
    return grad_norm


def hybrid_parallel_step(optimizer):
    """fleet's HybridParallelOptimizer.step in its two halves, returning the pre-clip gradient norm measured
    between them: under fleet hybrid parallel, gradients are reduced inside step(), not during backward,
    under sharding each to the sharding rank that updates the parameter. The norm is therefore each
    sharding rank's own parameters' norm, squared and summed over the sharding group, the tensor-parallel
    group (for the weights fleet's layers split) and the pipeline stages, a weight shared by two stages (a
    tied embedding) counted once (as fleet's HybridParallelClipGrad sums it)."""
    parameters = list(obtain_optimizer_parameters_list(optimizer._inner_opt))
    optimizer._hybrid_sync_grad(parameters)
    hcg = optimizer._hcg
    counted = [parameter for parameter in parameters if getattr(parameter, "is_firstly_shared", True)]
    groups = []
    if hcg.get_sharding_parallel_world_size() > 1:
        counted = optimizer._inner_opt.filter_parameters(counted, hcg)
        groups.append(hcg.get_sharding_parallel_group())
    if hcg.get_pipe_parallel_world_size() > 1:
        groups.append(hcg.get_pipe_parallel_group())
    # fleet's tensor-parallel blocks (is_distributed) sum over the group; a weight each of its ranks holds whole counts once.
    is_block = [getattr(parameter, "is_distributed", False) for parameter in counted]
    square = paddle.to_tensor(gradient_norm([p for p, block in zip(counted, is_block) if block]) ** 2, dtype="float64")
    if hcg.get_model_parallel_world_size() > 1:
        dist.all_reduce(square, group=hcg.get_model_parallel_group())
    square += gradient_norm([p for p, block in zip(counted, is_block) if not block]) ** 2
    for group in groups:
        dist.all_reduce(square, group=group)
    optimizer._step(parameters)
    return float(square.sqrt())
