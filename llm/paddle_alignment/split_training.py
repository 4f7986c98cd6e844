"""paddlenlp's Trainer over models split by the tensor-parallel plan (models/tensor_parallel.py), for RL,
reward-model training and fine-tuning alike.

paddlenlp wraps a tensor-parallel model in fleet's TensorParallel and HybridParallelOptimizer, made for
fleet's own TP layers; a model split by the plan is already distributed tensors that train as they are (as
under paddlenlp's AutoTrainer). What data parallel adds is done here instead: the first data rank's
parameters on every data rank, gradients averaged over the data ranks before each optimizer step, the
model saved whole, and what paddlenlp gathers over the ranks (the logged loss, evaluation outputs) taken
from each rank's own value (gloo's collectives take plain tensors).
"""

import paddle
from paddlenlp.trainer import TrainerCallback

from paddle_alignment.checkpoints.saving import save_model
from paddle_alignment.models.tensor_parallel import (
    average_gradients_over_data_ranks,
    broadcast_parameters_from_first_data_rank,
    is_tensor_parallel,
    local_value,
)


class SplitModelMixin:
    """For a paddlenlp Trainer subclass whose model the tensor-parallel plan may have split."""

    def _wrap_model(self, model, training=True):
        # paddlenlp leaves a model unwrapped for evaluation (training=False): nothing to copy then either.
        if not training or not is_tensor_parallel(model):
            return super()._wrap_model(model, training)
        if self.do_grad_scaling:
            raise ValueError("fp16 loss scaling does not run with tensor_parallel_degree > 1: use bf16")
        broadcast_parameters_from_first_data_rank(model)
        return model

    def save_model(self, output_dir=None, merge_tensor_parallel=False):
        """paddlenlp's save, except that a split model is gathered and written whole, as safetensors, by rank
        0 (every rank calls it), so that it loads on one device or splits again at any degree."""
        if not is_tensor_parallel(self.model):
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
