"""Paddle's AdamW and global-norm gradient clip, stepping every float32 CPU tensor in one fused op.

Paddle's CPU optimizer runs one `adamw_` per parameter, and its global-norm clip four ops per parameter: on a
small policy of many tensors the dispatch is a large share of the update (benchmarks/bench_optimizer.py
measures both). The ops of csrc/optimizer_ops.cc take the
whole list at once: `fused_adamw` (Paddle's formula, equal to its `adamw_` to a float32 rounding),
`fused_square_sum` (double accumulation) and `fused_scale`.

- `FusedAdamW` is Paddle's AdamW with the same arguments, accumulators and state dict, so a checkpoint of
  either loads into the other. Only the launch differs: dense float32 CPU parameters are collected as
  Paddle visits them and stepped together; the others (GPU, bfloat16 with master weights, amsgrad,
  parameter groups, tensor hyper-parameters) keep Paddle's per-parameter op.
- `FusedClipGradByGlobalNorm` is Paddle's ClipGradByGlobalNorm; when every gradient it clips is a dense
  float32 CPU tensor and no distributed group takes part in the norm, it measures and scales them in
  two fused ops, else it runs Paddle's. (fleet's hybrid-parallel optimizer replaces any global-norm clip
  with its own, so sharded and tensor-parallel runs are unaffected.)
- `gradient_norm(parameters)`: the global norm of their gradients, as the clip measures it (for logging).

`build_optimizer` (and `FusedOptimizerMixin`, for the reward-model, SFT and RL trainers) makes paddlenlp
Trainer's optimizer with them on CPU when the ops are built; PADDLE_ALIGNMENT_FUSED_KERNELS=off keeps
Paddle's own, as for the model's fused kernels.
"""

import math

import numpy as np
import paddle
from paddlenlp.trainer import Trainer

from paddle_alignment.distributed import SLICE_PREFIX
from paddle_alignment.models.fused_kernels import fusable, fused_ops

OPTIMIZER_OPS = ("fused_adamw", "fused_square_sum", "fused_scale")


def optimizer_ops():
    return fused_ops(OPTIMIZER_OPS, "the optimizer runs Paddle's per-parameter ops")


def dense_fusable(tensor):
    """A tensor the fused ops can read and write in place: dense, contiguous, float32, on the CPU."""
    return fusable(tensor) and not tensor.is_selected_rows() and tensor.is_contiguous()


def fused_square_sum(tensors):
    """The sum of squares of every element of `tensors` (a list of dense float32 CPU tensors), in float64."""
    return float(optimizer_ops().fused_square_sum(tensors))


class FusedAdamW(paddle.optimizer.AdamW):
    """paddle.optimizer.AdamW whose dense float32 CPU parameters step together in one `fused_adamw`."""

    def _create_optimization_pass(self, parameters_and_grads, param_group_idx=0):
        self._fused_batch = []  # a pass that raised leaves nothing behind for the next
        return super()._create_optimization_pass(parameters_and_grads, param_group_idx)

    def _fuses(self, param_and_grad):
        if isinstance(param_and_grad, dict) or self._amsgrad or self._lr_ratio is not None:
            return False
        hyper = (self._beta1, self._beta2, self._epsilon, self._weight_decay, param_and_grad[0].optimize_attr["learning_rate"])
        if not all(isinstance(value, (int, float)) for value in hyper):
            return False
        return all(dense_fusable(t) for t in param_and_grad) and optimizer_ops() is not None

    def _append_optimize_op(self, block, param_and_grad):
        """Paddle's per-parameter step, or, for a fusable parameter, its place in this step's fused batch."""
        if not (paddle.in_dynamic_mode() and self._fuses(param_and_grad)):
            return super()._append_optimize_op(block, param_and_grad)
        param, grad = param_and_grad
        decays = self._apply_decay_param_fun is None or self._apply_decay_param_fun(param.name)
        self._fused_batch.append((param, grad, param.optimize_attr["learning_rate"], self._weight_decay if decays else 0.0))
        return None

    def _finish_update(self, block, parameters_and_grads):
        super()._finish_update(block, parameters_and_grads)
        batch, self._fused_batch = self._fused_batch, []
        if not batch:
            return
        # The scheduled rate of this step (float64, as Paddle's kernel reads it), times each parameter's own factor.
        rate = float(self._global_learning_rate())
        params, grads, factors, coeffs = zip(*batch)
        accumulator = self._get_accumulator_master
        optimizer_ops().fused_adamw(
            [p.detach() for p in params],  # views of the same memory: custom ops may not write trainable leaves
            list(grads),
            [accumulator(self._moment1_acc_str, p) for p in params],
            [accumulator(self._moment2_acc_str, p) for p in params],
            [accumulator(self._beta1_pow_acc_str, p) for p in params],
            [accumulator(self._beta2_pow_acc_str, p) for p in params],
            [rate * factor for factor in factors],
            list(coeffs),
            self._beta1,
            self._beta2,
            self._epsilon,
        )


class FusedClipGradByGlobalNorm(paddle.nn.ClipGradByGlobalNorm):
    """paddle.nn.ClipGradByGlobalNorm whose norm and scaling of dense float32 CPU gradients are two fused ops."""

    @paddle.no_grad()
    def _dygraph_clip(self, params_grads):
        clipped = [g for p, g in params_grads if g is not None and getattr(p, "need_clip", True)]
        if self.should_comm_on_shard_dim or not clipped or optimizer_ops() is None or not all(map(dense_fusable, clipped)):
            return super()._dygraph_clip(params_grads)
        # The norm and factor in float32, as Paddle's clip and fleet's (sharding) compute them, so that a
        # sharded run and a single process scale by the same factor.
        norm = np.sqrt(np.float32(fused_square_sum(clipped)))
        clip_norm = np.float32(self.clip_norm)
        if norm > clip_norm or not self.auto_skip_clip:
            factor = clip_norm / max(norm, clip_norm)
            if factor != 1.0:  # Paddle multiplies by 1.0 then: no change
                optimizer_ops().fused_scale([g.detach() for g in clipped], float(factor))
        return params_grads


def gradient_norm(parameters):
    """The global L2 norm of the gradients of `parameters` (in float32 or finer), as the optimizer's
    global-norm clip measures it before clipping."""
    return math.sqrt(gradient_square_sum([p.grad for p in parameters if p.grad is not None]))


def gradient_square_sum(grads):
    """The sum of the squares of every element of `grads` (in float32 or finer)."""
    if not grads:
        return 0.0
    if optimizer_ops() is not None and all(map(dense_fusable, grads)):
        return fused_square_sum(grads)
    return float(paddle.add_n([paddle.square(g.astype("float32")).sum() for g in grads]))


def build_adamw_classes(device):
    """The AdamW and global-norm clip classes for training on `device`: the fused ones on CPU when the ops are
    built, else Paddle's."""
    if device == "cpu" and optimizer_ops() is not None:
        return FusedAdamW, FusedClipGradByGlobalNorm
    return paddle.optimizer.AdamW, paddle.nn.ClipGradByGlobalNorm


def decay_filter(model):
    """AdamW decays every weight but biases and norms (paddlenlp Trainer's rule)."""
    names = {p.name for n, p in model.named_parameters() if not any(nd in n for nd in ["bias", "norm"])}
    return lambda name: name.removeprefix(SLICE_PREFIX) in names


def build_optimizer(args, model, lr_scheduler, weight_decay):
    """paddlenlp Trainer's optimizer for `model` under TrainingArguments `args`: the `optim` key's class
    (AdamW by default, fused on CPU), decaying every weight but biases and norms by `weight_decay`, clipped
    to `max_grad_norm`, with master weights under fp16_opt_level O2."""
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    clip_cls = paddle.nn.ClipGradByGlobalNorm
    if optimizer_cls is paddle.optimizer.AdamW:
        optimizer_cls, clip_cls = build_adamw_classes(args.device)
    if hasattr(optimizer_cls, "_create_master_weight") and args.fp16_opt_level == "O2":
        optimizer_kwargs["multi_precision"] = True
    return optimizer_cls(
        learning_rate=lr_scheduler,
        parameters=model.parameters(),
        weight_decay=weight_decay,
        apply_decay_param_fun=decay_filter(model),
        grad_clip=clip_cls(args.max_grad_norm) if args.max_grad_norm > 0 else None,
        **optimizer_kwargs,
    )


class FusedOptimizerMixin:
    """For a paddlenlp Trainer subclass: its optimizer from `build_optimizer` (paddlenlp's own where the
    trainer was given grouped parameters)."""

    def create_optimizer(self, lr_scheduler=None):
        if self.optimizer is None and self.optimizer_grouped_parameters is None:
            schedule = self.lr_scheduler if lr_scheduler is None else lr_scheduler
            self.optimizer = build_optimizer(self.args, self.model, schedule, self.args.weight_decay)
        return super().create_optimizer(lr_scheduler)
