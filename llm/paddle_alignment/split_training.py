"""paddlenlp's Trainer over models split by the tensor-parallel plan (models/tensor_parallel.py), for RL,
reward-model training and fine-tuning alike.

paddlenlp wraps a tensor-parallel model in fleet's TensorParallel and HybridParallelOptimizer, made for
fleet's own TP layers; a model split by the plan is already distributed tensors that train as they are (as
under paddlenlp's AutoTrainer). What data parallel adds is done here instead: the first data rank's
parameters on every data rank, gradients averaged over the data ranks before each optimizer step, the
model saved whole, and what paddlenlp gathers over the ranks (the logged loss, evaluation outputs) taken
from each rank's own value (gloo's collectives take plain tensors). The optimizer (SplitOptimizer) saves
and loads this rank's parts of its states, so that paddlenlp's checkpoints and run_ppo's resume at the same
layout, and under sharding divides them over the sharding ranks as fleet's stage 1 does.
"""

import numpy as np
import paddle
from paddlenlp.trainer import TrainerCallback

from paddle_alignment.checkpoints.folders import checkpoint_to_resume
from paddle_alignment.checkpoints.saving import save_model
from paddle_alignment.distributed import hybrid_communicate_group
from paddle_alignment.fused_optimizer import gradient_norm
from paddle_alignment.models.split_loading import load_into
from paddle_alignment.models.tensor_parallel import (
    average_gradients_over_data_ranks,
    broadcast_parameters_from_first_data_rank,
    broadcast_parts,
    is_tensor_parallel,
    local_state,
    local_value,
    set_local_state,
)
from paddle_alignment.pipeline_parallel import is_pipeline_stage, load_stages


class SplitModelMixin:
    """For a paddlenlp Trainer subclass whose model the tensor-parallel plan may have split."""

    def _wrap_model(self, model, training=True):
        # paddlenlp leaves a model unwrapped for evaluation (training=False): nothing to copy then either.
        if not training or not is_tensor_parallel(model):
            return super()._wrap_model(model, training)
        if self.do_grad_scaling:
            raise ValueError("fp16 loss scaling does not run with tensor_parallel_degree > 1: use bf16")
        broadcast_parameters_from_first_data_rank(model)
        if self.optimizer is not None and not isinstance(self.optimizer, SplitOptimizer):
            self.optimizer = SplitOptimizer(self.optimizer, sharding_group())
        return model

    def _load_from_checkpoint(self, resume_from_checkpoint=None):
        """paddlenlp's resume of the model's weights, except that a split model reads its parts of the whole
        safetensors save_model wrote into the checkpoint, and a pipeline stage its stage's tensors of them."""
        if not resume_from_checkpoint or not (is_tensor_parallel(self.model) or is_pipeline_stage(self.model)):
            return super()._load_from_checkpoint(resume_from_checkpoint)
        if resume_from_checkpoint is True:  # from Python: the command line's `true` is resolved before (folders.py)
            resume_from_checkpoint = checkpoint_to_resume(self.args.output_dir)
        if is_pipeline_stage(self.model):
            load_stages(self.model, resume_from_checkpoint)
        else:
            load_into(self.model, resume_from_checkpoint)

    def save_model(self, output_dir=None, merge_tensor_parallel=False):
        """paddlenlp's save, except that a split model is gathered and written whole, as safetensors, by rank
        0, and a pipeline stage writes its part of one such folder (every rank calls it), so that it loads on
        one device or splits again at any layout."""
        if not (is_tensor_parallel(self.model) or is_pipeline_stage(self.model)):
            return super().save_model(output_dir, merge_tensor_parallel)
        save_model(self.model, output_dir or self.args.output_dir, self.tokenizer)

    def _nested_gather(self, tensors):
        return super()._nested_gather(local_values(tensors))


def local_values(tensors):
    """`tensors` (a tensor or nested lists, tuples and dicts of them) with each distributed tensor replaced by
    this rank's value: a split model's outputs are whole on every rank of its group."""
    if isinstance(tensors, paddle.Tensor):
        return local_value(tensors)
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(local_values(t) for t in tensors)
    if isinstance(tensors, dict):
        return {key: local_values(value) for key, value in tensors.items()}
    return tensors


class AverageSplitGradients(TrainerCallback):
    """In paddlenlp's training loop, a split model's gradients averaged over the data ranks right before the
    optimizer steps (paddlenlp reduces only what fleet's wrappers hold)."""

    def on_optimizer_begin(self, args, state, control, model=None, **kwargs):
        if is_tensor_parallel(model):
            average_gradients_over_data_ranks(model.parameters())


def sharding_group():
    """fleet's sharding group when the run shards over more than one rank, else None."""
    hcg = hybrid_communicate_group()
    group = hcg.get_sharding_parallel_group() if hcg is not None else None
    return group if group is not None and group.nranks > 1 else None


class SplitOptimizer:
    """The optimizer of a split model, as paddlenlp's Trainer and run_ppo use it.

    Its state dict holds this rank's parts of the states, as plain tensors (what paddle.save writes and
    gloo broadcasts), and loads back into accumulators split like their parameters. With a sharding
    `group`, it is sharding stage 1, as fleet's DygraphShardingOptimizer shards the models it wraps: each
    parameter belongs to one rank of the group (dealt by size), whose optimizer alone steps it and keeps its
    states (AdamW's moments, master weights), then sends it to the others. Every rank holds every gradient,
    averaged over the data ranks before the step; the global-norm clip measures all of them, so each rank
    scales by a single process's factor."""

    def __init__(self, optimizer, group=None):
        if any(isinstance(entry, dict) for entry in optimizer._parameter_list):
            raise ValueError("tensor_parallel_degree > 1 takes an optimizer without parameter groups")
        self.optimizer, self.group = optimizer, group
        self.parameters = list(optimizer._parameter_list)
        if group is None:
            return
        self.owners = deal_by_size(self.parameters, group.nranks)
        # (AdamW steps its _parameter_list, Paddle's other optimizers their _param_groups: one list)
        optimizer._parameter_list = optimizer._param_groups = self.owned_by(group.rank)
        if isinstance(optimizer._grad_clip, paddle.nn.ClipGradByGlobalNorm):
            optimizer._grad_clip = ClipByNormOfAll(optimizer._grad_clip.clip_norm, self.parameters)

    def owned_by(self, rank):
        return [parameter for parameter, owner in zip(self.parameters, self.owners) if owner == rank]

    def step(self):
        self.optimizer.step()
        if self.group is None:
            return
        for rank, source in enumerate(self.group.ranks):
            broadcast_parts(self.owned_by(rank), source, self.group, "the stepped parameters' broadcast over the sharding ranks")

    def clear_grad(self, set_to_zero=True):
        for parameter in self.parameters:
            parameter.clear_gradient(set_to_zero)

    def state_dict(self):
        return local_state(self.optimizer.state_dict())

    def set_state_dict(self, state):
        set_local_state(self.optimizer, state)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


def deal_by_size(parameters, ranks):
    """The owning rank of each of `parameters`: each in turn to the rank holding the fewest elements so far."""
    held, owners = [0] * ranks, []
    for parameter in parameters:
        owner = held.index(min(held))
        owners.append(owner)
        held[owner] += local_value(parameter).size
    return owners


class ClipByNormOfAll(paddle.nn.ClipGradByGlobalNorm):
    """Paddle's global-norm clip (float32 factor clip_norm / max(norm, clip_norm)) of the gradients a sharding
    rank steps, by the norm of all of `parameters`' gradients rather than of those alone."""

    def __init__(self, clip_norm, parameters):
        super().__init__(clip_norm)
        self.parameters = parameters

    @paddle.no_grad()
    def _dygraph_clip(self, params_grads):
        norm, clip_norm = np.float32(gradient_norm(self.parameters)), np.float32(self.clip_norm)
        if norm > clip_norm:
            for parameter, grad in params_grads:
                if grad is not None and getattr(parameter, "need_clip", True):
                    local_value(grad).scale_(float(clip_norm / norm))
        return params_grads
