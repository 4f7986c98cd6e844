"""Parameters of the layout in memory and across processes: the models' fused kernels (PaddleNLP's switches),
recompute and offload, and the parallel degrees checked against the launch (paddlenlp's TrainingArguments
keys)."""

import math
from dataclasses import dataclass, field
from typing import Optional

import paddle
from paddlenlp.utils.log import logger

from paddle_alignment.offload import parse_offload_level

# paddlenlp's recompute granularities (config.recompute_granularity of Qwen2 and Llama).
RECOMPUTE_GRANULARITIES = ("full", "full_attn", "core_attn")


@dataclass
class ModelKernelArguments:
    """PaddleNLP's fused-kernel switches of the models (paddlenlp's LlmMetaConfig keys), set on the model
    configs at load. The fused kernels are GPU kernels: on CPU they are switched off, with a log line."""

    use_flash_attention: bool = field(default=False, metadata={"help": "Flash attention in the models (GPU; set on the model configs, switched off with a log line on CPU)."})
    use_fused_rms_norm: bool = field(default=False, metadata={"help": "Fused RMSNorm kernel in the models (GPU; set on the model configs, switched off with a log line on CPU)."})
    use_fused_rope: bool = field(default=False, metadata={"help": "Fused rotary-embedding kernel in the models (GPU; set on the model configs, switched off with a log line on CPU)."})
    use_fused_linear: bool = field(
        default=False, metadata={"help": "fused_gemm_epilogue linear layers; paddlenlp's Qwen2 and Llama do not read it."}
    )
    recompute_use_reentrant: Optional[bool] = field(
        default=None, metadata={"help": "Reentrant recompute (paddle's recompute use_reentrant); default the model config's."}
    )

    def model_config_flags(self):
        """The model-config attributes these keys set (recompute_use_reentrant only when given)."""
        flags = {key: getattr(self, key) for key in FUSED_KERNEL_KEYS}
        if self.recompute_use_reentrant is not None:
            flags["recompute_use_reentrant"] = self.recompute_use_reentrant
        return flags

    def switch_off_gpu_kernels(self, on_accelerator):
        for key in FUSED_KERNEL_KEYS:
            if getattr(self, key) and not on_accelerator:
                logger.info(f"{key}=True has no effect on CPU: it selects a fused GPU kernel")
                setattr(self, key, False)
        if self.use_fused_linear:
            logger.info("use_fused_linear (fused_linear) has no effect: paddlenlp's Qwen2 and Llama layers do not read it")


FUSED_KERNEL_KEYS = ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "use_fused_linear")


@dataclass
class ParallelLayoutArguments:
    """Parameters that control the layout in memory: recompute and offload (the parallel degrees are paddlenlp's TrainingArguments keys)."""

    recompute_granularity: str = field(
        default="full", metadata={"help": "What the actor recomputes with recompute: full, full_attn or core_attn."}
    )
    offload_level: str = field(
        default="",
        metadata={"help": "GPU only: any of freeze_model (reference, teacher and reward models), optimizer (optimizer states), train_model (actor and critic), space separated, kept in pinned host memory except while used. On CPU it has no effect, and says so once."},
    )
    offload_optim: bool = field(default=False, metadata={"help": "Offload the optimizer states (adds optimizer to offload_level)."})
    eval_mode: str = field(
        default="single",
        metadata={"help": "Under pipeline parallel (PaddleNLP's key; empty is single), how the non-pipeline models that roll out, score and evaluate (actor, critic, reference, reward model) are held: single, whole on every rank; tensor_parallel, split by the tensor-parallel plan over every rank of a data replica (its pipeline x tensor-parallel ranks), the stages' weights moved into them after each update. Without pipeline parallel they run on the training layout."},
    )
    rollout_tensor_parallel_degree: int = field(
        default=-1,
        metadata={"help": "How many ranks the rollout's models split over (PaddleNLP's key): -1 for what the layout gives (tensor_parallel_degree; under pipeline parallel 1 with eval_mode single, pipeline x tensor_parallel_degree with eval_mode tensor_parallel); another value is refused."},
    )

    def validate_scale_out(self):
        """The parallel layout, offload groups and recompute granularities."""
        check_launch_layout(self, pipeline_parallel=True)
        check_rollout_layout(self)
        self.switch_off_gpu_kernels(runs_on_accelerator(self))
        self.offload_level = " ".join(sorted(parse_offload_level(self.offload_level)))
        for key in ("recompute_granularity", "critic_recompute_granularity"):
            if getattr(self, key) not in RECOMPUTE_GRANULARITIES:
                raise ValueError(f"{key}={getattr(self, key)!r}: choose from {RECOMPUTE_GRANULARITIES}")


EVAL_MODES = ("single", "tensor_parallel")


def rollout_split_degree(args):
    """How many ranks the non-pipeline models (rollout, log-probs, values, evaluation, reference and reward)
    split over: the tensor-parallel degree; under pipeline parallel 1 (eval_mode single) or every pipeline x
    tensor-parallel rank of a data replica (eval_mode tensor_parallel)."""
    tensor_parallel = max(args.tensor_parallel_degree, 1)
    if args.pipeline_parallel_degree <= 1:
        return tensor_parallel
    return tensor_parallel * args.pipeline_parallel_degree if args.eval_mode == "tensor_parallel" else 1


def check_rollout_layout(args):
    """eval_mode (PaddleNLP's empty value is single) and a rollout_tensor_parallel_degree the layout gives."""
    args.eval_mode = args.eval_mode or "single"
    if args.eval_mode not in EVAL_MODES:
        raise ValueError(f"eval_mode={args.eval_mode!r}: choose from {EVAL_MODES}")
    if args.eval_mode != "single" and args.pipeline_parallel_degree <= 1:
        logger.info(f"eval_mode={args.eval_mode} has no effect without pipeline parallel: the rollout runs on the training layout")
    degree = rollout_split_degree(args)
    if args.rollout_tensor_parallel_degree not in (-1, degree):
        raise ValueError(
            f"rollout_tensor_parallel_degree={args.rollout_tensor_parallel_degree}: the rollout's models split over "
            f"{degree} rank(s) in this layout (tensor_parallel_degree={args.tensor_parallel_degree}, pipeline_parallel_degree="
            f"{args.pipeline_parallel_degree}, eval_mode={args.eval_mode}); give -1 or {degree}"
        )


def check_parallel_degrees(args, world_size, on_accelerator):
    """Parallel degrees against the launched processes, before paddlenlp's own asserts: tensor x pipeline
    (x sharding) ranks must divide the world. Tensor parallel (Paddle's auto-parallel plan,
    models/tensor_parallel.py) runs with data parallel and sharding stage 1 over the other ranks; sharding
    stage 1 runs on CPU too; stages 2 and 3 (paddle's group_sharded_parallel) need GPUs."""
    sharding = args.sharding not in ("", [], None, False)
    degrees = {
        "tensor_parallel_degree": max(args.tensor_parallel_degree, 1),
        "pipeline_parallel_degree": max(args.pipeline_parallel_degree, 1),
        "sharding_parallel_degree": max(args.sharding_parallel_degree, 1) if sharding else 1,
    }
    used = {key: value for key, value in degrees.items() if value > 1}
    replica = math.prod(degrees.values())
    if world_size % replica:
        product = " x ".join(f"{key}={value}" for key, value in used.items())
        raise ValueError(
            f"{product} = {replica} ranks per data-parallel replica does not divide the {world_size} launched "
            "process(es) (paddle.distributed.launch --devices / --nproc_per_node)"
        )
    tensor_parallel = degrees["tensor_parallel_degree"]
    if args.sequence_parallel:
        logger.info(
            "sequence_parallel=True has no effect: "
            + ("the tensor-parallel plan splits weights, not activations" if tensor_parallel > 1 else "tensor_parallel_degree is 1")
        )
        args.sequence_parallel = False
    stages = sharding_stages(args.sharding)
    sharding_ranks = args.sharding_parallel_degree if args.sharding_parallel_degree > 0 else world_size // replica
    if sharding and sharding_ranks <= 1:
        logger.info(f"sharding={args.sharding} over one rank has no effect (sharding_parallel_degree={args.sharding_parallel_degree})")
        args.sharding = ""
    elif sharding and stages - {"stage1"} and not on_accelerator:
        raise ValueError(
            f"sharding={args.sharding}: stages 2 and 3 (paddle's group_sharded_parallel) need GPUs; "
            "on CPU use sharding stage1"
        )
    elif sharding and tensor_parallel > 1:
        logger.info(
            f"sharding={args.sharding} with tensor_parallel_degree={tensor_parallel}: each of the {sharding_ranks} sharding "
            "ranks steps and keeps the optimizer states of its share of its tensor-parallel part's parameters (stage 1"
            + ("; stages 2 and 3, which would also divide gradients and parameters, run as stage 1 under tensor parallel)" if stages - {"stage1"} else ")")
        )


def sharding_stages(sharding):
    """The names in paddlenlp's `sharding` key: its string ("stage1 offload"), or the ShardingOption list its
    TrainingArguments makes of it."""
    options = sharding if isinstance(sharding, (list, tuple)) else str(sharding or "").split()
    return {getattr(option, "value", option) for option in options}


def slices_weights(args):
    """Whether sharding stage 3 holds the weights in slices: `sharding stage3` without tensor parallel (under
    which it runs as stage 1)."""
    return "stage3" in sharding_stages(args.sharding) and args.tensor_parallel_degree <= 1


def check_launch_layout(args, pipeline_parallel=False):
    """`check_parallel_degrees` for this launch (its process count, whether it runs on an accelerator), after
    refusing pipeline parallel where the entry point does not run it (`pipeline_parallel`: RL and reward-model
    training do)."""
    if not pipeline_parallel:
        refuse_pipeline_parallel(args)
    check_parallel_degrees(args, paddle.distributed.get_world_size(), runs_on_accelerator(args))
    if args.pipeline_parallel_degree > 1:
        check_pipeline_layout(args)


def refuse_pipeline_parallel(args):
    """Stop an entry point that does not run pipeline-parallel models (run_dpo.py and run_kto.py) under one."""
    if args.pipeline_parallel_degree > 1:
        raise ValueError(
            f"pipeline_parallel_degree={args.pipeline_parallel_degree}: this entry point does not run pipeline-"
            "parallel models yet (run_ppo.py, run_finetune.py and run_reward.py do); split large models with "
            "tensor_parallel_degree and sharding"
        )


def check_pipeline_layout(args):
    """What training under pipeline parallel composes with: tensor parallel inside the stages (fleet's split
    layers) and data parallel; micro-batches whose widths change from step to step (rollouts and batches of
    varying lengths), so the stages exchange each micro-batch's shapes."""
    if sharding_stages(args.sharding):
        raise ValueError(
            f"pipeline_parallel_degree={args.pipeline_parallel_degree} with sharding={args.sharding}: pipeline stages "
            "run with data parallel only yet"
        )
    options = str(args.pipeline_parallel_config or "").split()
    for option in sorted(set(options) - PIPELINE_OPTIONS_KEPT):
        logger.info(
            f"pipeline_parallel_config {option} has no effect: the stages train with fleet's 1F1B schedule, each "
            "micro-batch's loss already its share of the step"
        )
    kept = [option for option in options if option in PIPELINE_OPTIONS_KEPT]
    args.pipeline_parallel_config = " ".join(kept + ([] if "disable_p2p_cache_shape" in kept else ["disable_p2p_cache_shape"]))


# paddlenlp's pipeline_parallel_config options that leave the training's schedule and step as they are.
PIPELINE_OPTIONS_KEPT = {"disable_p2p_cache_shape", "disable_partial_send_recv"}


def runs_on_accelerator(args):
    return args.device != "cpu" and paddle.device.get_device() != "cpu"
