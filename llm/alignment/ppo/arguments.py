"""Arguments of RL alignment, read from one JSON file with PaddleNLP's `PdArgumentParser`.

Key names follow PaddleNLP's `llm/alignment/ppo` where the meaning is the same, so its configs work here.
Everything is checked at start: unknown keys and impossible combinations stop the run with a message
naming the key.
"""

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from typing import Optional

import paddle
from paddlenlp.trainer import PdArgumentParser, TrainingArguments
from paddlenlp.utils.log import logger

from llm.alignment.ppo.algos import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LR_SCHEDULES,
    POLICY_LOSSES,
)
from llm.alignment.ppo.offload_utils import parse_offload_level
from llm.alignment.ppo.rewards import REWARD_TASKS

# Other names users' PaddleNLP configs use for the same setting.
KEY_ALIASES = {"num_return_sequences": "rollout_n"}

# paddlenlp's recompute granularities (config.recompute_granularity of Qwen2 and Llama).
RECOMPUTE_GRANULARITIES = ("full", "full_attn", "core_attn")


@dataclass
class ModelArgument:
    actor_model_name_or_path: str = field(metadata={"help": "Local path of the policy (actor) model."})
    reference_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Frozen reference model for the KL term; defaults to the actor's path."}
    )
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata={"help": "Tokenizer path; defaults to the actor's."})
    reward_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Reward model (llm/alignment/rm output) that scores responses."}
    )
    reward_critic_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Initial critic (ppo); defaults to the reward model, else the actor's backbone."}
    )
    lora: bool = field(default=False, metadata={"help": "Train LoRA adapters of the actor instead of all its weights."})
    lora_path: Optional[str] = field(default=None, metadata={"help": "Adapters (a saved policy folder) to start the LoRA actor from."})
    lora_rank: int = field(default=8, metadata={"help": "Rank of the LoRA adapters."})
    lora_alpha: Optional[int] = field(default=None, metadata={"help": "LoRA scaling numerator (adapters scale by alpha / rank); default 2 x lora_rank."})
    lora_target_modules: Optional[str] = field(
        default=None,
        metadata={"help": "Comma-separated regexes of the layers that get adapters; default the attention and MLP projections."},
    )
    lora_save_merged: bool = field(
        default=False, metadata={"help": "Also save output_dir/policy_merged: the actor with its adapters merged into the weights."}
    )


@dataclass
class DataArgument:
    train_datasets: str = field(
        metadata={"help": "Prompts for rollouts: `name[:proportion[:path]]` entries or data files, comma separated."}
    )
    eval_datasets: Optional[str] = field(default=None, metadata={"help": "Held-out prompts, in the same format."})
    ptx_datasets: Optional[str] = field(default=None, metadata={"help": "Supervised data of the ptx loss (ppo), in the same format."})
    prompt_key: str = field(default="src", metadata={"help": "Column of data files holding the literal prompt."})
    label_key: str = field(default="tgt", metadata={"help": "Column of data files holding the reference answer given to the reward."})
    max_prompt_len: int = field(default=1024, metadata={"help": "Prompts with more tokens are skipped (and counted)."})
    max_length: int = field(default=2048, metadata={"help": "Upper bound of prompt plus response tokens."})
    max_eval_samples: int = field(default=0, metadata={"help": "Evaluate on at most this many prompts (0: all)."})

    def __post_init__(self):
        for key in ("max_prompt_len", "max_length"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.max_eval_samples < 0:
            raise ValueError(f"max_eval_samples must be >= 0 (0: all), got {self.max_eval_samples}")


@dataclass
class RLTrainingArguments(TrainingArguments):
    rl_algorithm: str = field(default="grpo", metadata={"help": "Advantage estimator: " + ", ".join(ADVANTAGE_ESTIMATORS.names())})
    rollout_n: int = field(default=8, metadata={"help": "Samples per prompt (alias: num_return_sequences)."})
    per_device_prompt_batch_size: int = field(default=1, metadata={"help": "Prompts per rank per RL step."})
    max_dec_len: int = field(default=512, metadata={"help": "Most tokens generated per response."})
    min_dec_len: int = field(default=1, metadata={"help": "EOS is forbidden before this many tokens."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass during rollout."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature during rollout."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "CTRL-style repetition penalty during rollout."})
    top_k: int = field(default=0, metadata={"help": "Sample among the k most likely tokens (0: no limit)."})
    use_fusemt: bool = field(
        default=True, metadata={"help": "Decode with the paddlenlp_ops fast loop when installed (else generate())."}
    )
    update_iters: int = field(default=1, metadata={"help": "Passes over each rollout batch."})
    kl_loss_coeff: float = field(default=0.001, metadata={"help": "Weight of the KL-to-reference loss (0 disables the reference model)."})
    kl_estimator: str = field(default="k3", metadata={"help": "KL estimator: k1, k2 or k3."})
    kl_coeff: float = field(
        default=0.0,
        metadata={"help": "Weight of the k1 KL penalty in the token rewards (ppo, reinforce_plus_plus; other algorithms ignore it, with a warning)."},
    )
    gamma: float = field(default=1.0, metadata={"help": "Discount of the token returns (ppo, reinforce_plus_plus)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (ppo)."})
    normalize_advantage: bool = field(default=True, metadata={"help": "Whiten GAE advantages over valid tokens (ppo)."})
    normalize_reward: bool = field(
        default=False, metadata={"help": "Normalise rewards by running mean and std over all ranks (kept in checkpoints)."}
    )
    clip_range_value: float = field(default=5.0, metadata={"help": "Critic values move at most this far from their rollout values (ppo)."})
    ptx_coeff: float = field(default=0.0, metadata={"help": "Weight of the language-model loss on ptx_datasets (ppo)."})
    missing_eos_penalty: float = field(default=0.0, metadata={"help": "Subtracted from the reward of responses that never emit EOS."})
    max_gen_batches: int = field(
        default=0,
        metadata={"help": "DAPO dynamic sampling: drop groups of equal rewards and generate up to this many batches to fill a step (0: off)."},
    )
    critic_learning_rate: float = field(default=5e-6, metadata={"help": "Critic peak learning rate (ppo)."})
    critic_min_learning_rate: float = field(default=0.0, metadata={"help": "The critic's schedule decays to this."})
    critic_weight_decay: float = field(default=0.0, metadata={"help": "Critic AdamW weight decay."})
    critic_lr_scheduler_type: str = field(default="constant", metadata={"help": "Critic schedule: linear, cosine or constant."})
    critic_warmup_ratio: float = field(default=0.0, metadata={"help": "Share of steps of critic warm-up."})
    critic_recompute: bool = field(default=False, metadata={"help": "Recompute critic activations in backward to save memory."})
    recompute_granularity: str = field(
        default="full", metadata={"help": "What the actor recomputes with recompute: full, full_attn or core_attn."}
    )
    critic_recompute_granularity: str = field(
        default="full", metadata={"help": "What the critic recomputes: full, full_attn or core_attn (as recompute_granularity)."}
    )
    offload_level: str = field(
        default="",
        metadata={"help": "Keep in host memory except while used (GPU only): any of freeze_model, optimizer, train_model, space separated."},
    )
    policy_loss: str = field(default="ppo_clip", metadata={"help": "Policy loss: " + ", ".join(POLICY_LOSSES.names())})
    entropy_coeff: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus (0: off)."})
    clip_range_ratio: float = field(default=0.2, metadata={"help": "PPO ratio clip, both sides unless _low/_high are given."})
    clip_range_ratio_low: Optional[float] = field(default=None, metadata={"help": "Lower clip: ratio >= 1 - this."})
    clip_range_ratio_high: Optional[float] = field(default=None, metadata={"help": "Upper clip: ratio <= 1 + this (DAPO clip-higher)."})
    clip_ratio_c: float = field(
        default=3.0,
        metadata={"help": "Dual-clip PPO (ppo_clip): the loss of a negative-advantage token is at most -A x this (verl's key and default; 0: off)."},
    )
    clip_range_score: float = field(default=50.0, metadata={"help": "Rewards are clipped to [-this, this]."})
    overlong_reward_buffer: int = field(
        default=0, metadata={"help": "DAPO overlong penalty: responses longer than max_dec_len - this are penalised (0: off)."}
    )
    overlong_penalty_factor: float = field(default=1.0, metadata={"help": "Penalty of a response of max_dec_len tokens."})
    loss_agg_mode: Optional[str] = field(
        default=None,
        metadata={
            "help": "Loss aggregation over the optimizer step's tokens: " + ", ".join(LOSS_AGGREGATIONS.names())
            + " (default token-mean; gspo always seq-mean-token-mean)."
        },
    )
    norm_adv_by_std_in_grpo: bool = field(default=True, metadata={"help": "Divide group advantages by the group std (False: Dr.GRPO)."})
    min_learning_rate: float = field(default=0.0, metadata={"help": "The schedule decays to this learning rate."})
    use_rm_server: bool = field(default=False, metadata={"help": "Score responses with the reward server."})
    reward_server: str = field(default="http://127.0.0.1:8731", metadata={"help": "URL of the reward server."})
    reward_server_timeout: float = field(default=60.0, metadata={"help": "Seconds to wait for one reward request."})
    reward_server_max_retries: int = field(
        default=3, metadata={"help": "Retries of a reward request that met an outage (no answer, timeout, 5xx without a protocol error), with exponential backoff, before the run stops."}
    )
    use_rule_reward: bool = field(default=False, metadata={"help": "Score responses in-process with the rule reward of reward_task."})
    reward_task: str = field(default="kk", metadata={"help": "Rule reward task: " + ", ".join(sorted(REWARD_TASKS))})
    sample_log_interval: int = field(default=5, metadata={"help": "Write a table of sample completions every logging_steps * this steps."})
    num_sample_logs: int = field(default=4, metadata={"help": "Rows in each sample table."})

    def __post_init__(self):
        self.validate_scale_out()
        super().__post_init__()
        self.lr_scheduler_type = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
        self.critic_lr_scheduler_type = getattr(self.critic_lr_scheduler_type, "value", self.critic_lr_scheduler_type)
        if self.clip_range_ratio_low is None:
            self.clip_range_ratio_low = self.clip_range_ratio
        if self.clip_range_ratio_high is None:
            self.clip_range_ratio_high = self.clip_range_ratio
        self.validate_rl()

    @property
    def kl_in_reward(self):
        """The token rewards carry a KL penalty, which needs the rollout policy's and the reference's log-probs."""
        return ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).kl_in_reward and self.kl_coeff > 0

    @property
    def uses_critic(self):
        return ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).critic

    @property
    def uses_reference_model(self):
        return self.kl_loss_coeff > 0 or self.kl_in_reward

    @property
    def rollout_batch_size(self):
        """Responses generated per rank per RL step."""
        return self.per_device_prompt_batch_size * self.rollout_n

    @property
    def optimizer_steps_per_rl_step(self):
        micro_batches = self.rollout_batch_size // self.per_device_train_batch_size
        return self.update_iters * micro_batches // self.gradient_accumulation_steps

    def validate_scale_out(self):
        """The parallel layout, offload groups and recompute granularities."""
        check_launch_layout(self)
        self.offload_level = " ".join(sorted(parse_offload_level(self.offload_level)))
        for key in ("recompute_granularity", "critic_recompute_granularity"):
            if getattr(self, key) not in RECOMPUTE_GRANULARITIES:
                raise ValueError(f"{key}={getattr(self, key)!r}: choose from {RECOMPUTE_GRANULARITIES}")

    def resolve_loss_agg_mode(self):
        """An unset loss_agg_mode is token-mean; a policy loss defined with its own aggregation (gspo: per
        sequence) always gets it, with a warning when the config asks for another."""
        if self.policy_loss not in POLICY_LOSSES.names():
            return  # validate_rl names the key
        required = POLICY_LOSSES.traits(self.policy_loss).loss_agg_mode
        if required and self.loss_agg_mode not in (None, required):
            logger.warning(
                f"policy_loss={self.policy_loss} is defined per sequence: loss_agg_mode={self.loss_agg_mode!r} "
                f"is replaced by {required!r} (the GSPO paper; verl's compute_policy_loss_gspo)"
            )
        self.loss_agg_mode = required or self.loss_agg_mode or "token-mean"

    def validate_rl(self):
        self.resolve_loss_agg_mode()
        choices = {
            "rl_algorithm": ADVANTAGE_ESTIMATORS,
            "kl_estimator": KL_ESTIMATORS,
            "policy_loss": POLICY_LOSSES,
            "loss_agg_mode": LOSS_AGGREGATIONS,
            "lr_scheduler_type": LR_SCHEDULES,
            "critic_lr_scheduler_type": LR_SCHEDULES,
        }
        for key, registry in choices.items():
            value = getattr(self, key)
            if value not in registry.names():
                raise ValueError(f"{key}={value!r} is not available; choose from {registry.names()}")
        positive = [
            "rollout_n", "per_device_prompt_batch_size", "max_dec_len", "update_iters", "max_steps", "sample_log_interval",
            "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "reward_server_timeout",
        ]
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.kl_coeff > 0 and not ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).kl_in_reward:
            logger.warning(
                f"kl_coeff={self.kl_coeff} has no effect with rl_algorithm={self.rl_algorithm}: it puts a KL penalty in "
                "the token rewards of ppo and reinforce_plus_plus; use kl_loss_coeff for a KL loss"
            )
        if self.clip_ratio_c and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c={self.clip_ratio_c} must be > 1 (dual clip caps the loss at -A x clip_ratio_c), or 0 for off")
        if ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).group_baseline and self.rollout_n < 2:
            raise ValueError(
                f"rollout_n={self.rollout_n}: {self.rl_algorithm} compares samples of one prompt, so it needs rollout_n >= 2"
            )
        if not 0 <= self.min_dec_len <= self.max_dec_len:
            raise ValueError(f"min_dec_len={self.min_dec_len} must lie in [0, max_dec_len={self.max_dec_len}]")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        for key in [
            "clip_range_ratio_low", "clip_range_ratio_high", "clip_range_score", "kl_loss_coeff", "entropy_coeff",
            "kl_coeff", "overlong_penalty_factor", "reward_server_max_retries", "clip_range_value", "ptx_coeff",
            "missing_eos_penalty", "max_gen_batches", "critic_weight_decay", "clip_ratio_c", "save_steps", "eval_steps",
            "logging_steps", "save_total_limit", "num_sample_logs", "learning_rate", "weight_decay", "warmup_steps",
            "max_grad_norm", "critic_learning_rate",
        ]:
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.clip_range_ratio_low >= 1:
            raise ValueError(f"clip_range_ratio_low={self.clip_range_ratio_low} must be < 1 (ratios are positive)")
        if not 0 <= self.overlong_reward_buffer <= self.max_dec_len:
            raise ValueError(
                f"overlong_reward_buffer={self.overlong_reward_buffer} must lie in [0, max_dec_len={self.max_dec_len}]"
            )
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1], got {self.gamma}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must lie in [0, 1], got {self.lam}")
        if self.max_gen_batches and self.rollout_n < 2:
            raise ValueError(f"max_gen_batches={self.max_gen_batches} filters groups of samples, so it needs rollout_n >= 2")
        if not 0 <= self.critic_min_learning_rate <= self.critic_learning_rate:
            raise ValueError(
                f"critic_min_learning_rate={self.critic_min_learning_rate} must lie in [0, critic_learning_rate={self.critic_learning_rate}]"
            )
        if not 0 <= self.critic_warmup_ratio < 1:
            raise ValueError(f"critic_warmup_ratio must lie in [0, 1), got {self.critic_warmup_ratio}")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise ValueError(f"min_learning_rate={self.min_learning_rate} must lie in [0, learning_rate={self.learning_rate}]")
        if self.use_rule_reward and self.reward_task not in REWARD_TASKS:
            raise ValueError(f"reward_task={self.reward_task!r} is not registered; choose from {sorted(REWARD_TASKS)}")
        if self.rollout_batch_size % self.per_device_train_batch_size:
            raise ValueError(
                f"per_device_prompt_batch_size * rollout_n = {self.rollout_batch_size} responses must split into "
                f"micro-batches of per_device_train_batch_size={self.per_device_train_batch_size}"
            )
        micro_batches = self.rollout_batch_size // self.per_device_train_batch_size
        if (self.update_iters * micro_batches) % self.gradient_accumulation_steps:
            raise ValueError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps} must divide the "
                f"{self.update_iters * micro_batches} micro-batches of one RL step (update_iters * rollout_batch / per_device_train_batch_size)"
            )


def check_parallel_degrees(args, world_size, on_accelerator):
    """Parallel degrees against the launched processes, before paddlenlp's own asserts: tensor x pipeline
    (x sharding) ranks must divide the world. Tensor parallel (Paddle's auto-parallel plan,
    models/tensor_parallel.py) runs alone; sharding stage 1 runs with data parallel, on CPU too; stages 2
    and 3 (paddle's group_sharded_parallel) need GPUs."""
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
        raise ValueError(
            "sequence_parallel: the tensor-parallel plan splits weights, not activations; remove the key"
        )
    if tensor_parallel > 1 and world_size != tensor_parallel:
        raise ValueError(
            f"tensor_parallel_degree={tensor_parallel} over {world_size} launched processes: tensor parallel runs "
            "alone (every process in one tensor-parallel group), without data parallel or sharding; launch "
            f"{tensor_parallel} processes, or use sharding stage1 over all of them"
        )
    stages = set(args.sharding) if isinstance(args.sharding, (list, tuple)) else set(str(args.sharding or "").split())
    if sharding and stages - {"stage1"} and not on_accelerator:
        raise ValueError(
            f"sharding={args.sharding}: stages 2 and 3 (paddle's group_sharded_parallel) need GPUs; "
            "on CPU use sharding stage1"
        )


def refuse_tensor_parallel(args, stage):
    """SFT and reward-model training run data parallel and sharding stage1: paddlenlp's Trainer would wrap
    a model split by the tensor-parallel plan in fleet's TP wrappers, which expect fleet's own TP layers."""
    if args.tensor_parallel_degree > 1:
        raise ValueError(
            f"tensor_parallel_degree={args.tensor_parallel_degree}: {stage} runs data parallel and sharding stage1; "
            "tensor parallel is run_ppo's"
        )


def check_launch_layout(args):
    """`check_parallel_degrees` for this launch (its process count, whether it runs on an accelerator), after
    refusing pipeline parallel, which neither the RL loop nor reward-model training drives yet."""
    if args.pipeline_parallel_degree > 1:
        raise ValueError(
            f"pipeline_parallel_degree={args.pipeline_parallel_degree}: training does not run pipeline-parallel "
            "models yet (the pipe policy and value models of models/model_pp.py are checked single-stage only); "
            "split large models with tensor_parallel_degree and sharding instead"
        )
    on_accelerator = args.device != "cpu" and paddle.device.get_device() != "cpu"
    check_parallel_degrees(args, paddle.distributed.get_world_size(), on_accelerator)


ARGUMENT_CLASSES = (ModelArgument, DataArgument, RLTrainingArguments)


def parse_arguments(argv, argument_classes=ARGUMENT_CLASSES):
    """`argv` = [config.json, --key value ...]: the JSON file first, command-line overrides after it."""
    if not argv or not argv[0].endswith(".json"):
        raise ValueError("usage: <script> CONFIG.json [--key value ...]")
    parser = PdArgumentParser(argument_classes)
    try:
        tokens = parser.read_json(argv[0]) + list(argv[1:])
    except json.JSONDecodeError as error:
        raise ValueError(f"config file {argv[0]} is not valid JSON: {error}") from None
    tokens = [resolve_key(token, argument_classes) if token.startswith("--") else token for token in tokens]
    parsed = parser.parse_args_into_dataclasses(args=tokens, look_for_args_file=False)
    validate_across(parsed)
    return parsed


def resolve_key(token, argument_classes):
    """Map an alias to its key and reject keys that no argument class knows, suggesting the closest one."""
    key = KEY_ALIASES.get(token[2:], token[2:])
    valid = {f.name for cls in argument_classes for f in dataclasses.fields(cls) if f.init}
    if key not in valid:
        hint = difflib.get_close_matches(key, valid, n=1)
        raise ValueError(f"unknown config key {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
    return f"--{key}"


def validate_across(parsed):
    """Checks that involve keys of more than one argument class."""
    model_args = next((a for a in parsed if isinstance(a, ModelArgument)), None)
    data_args = next((a for a in parsed if isinstance(a, DataArgument)), None)
    training_args = next((a for a in parsed if isinstance(a, RLTrainingArguments)), None)
    if model_args and training_args:
        sources = [training_args.use_rm_server, training_args.use_rule_reward, model_args.reward_model_name_or_path is not None]
        if sum(sources) != 1:
            raise ValueError(
                "set exactly one reward source: use_rm_server (reward server), use_rule_reward (in-process rule) "
                "or reward_model_name_or_path (reward model)"
            )
    if model_args and not model_args.lora:
        for key in ("lora_path", "lora_target_modules", "lora_save_merged"):
            if getattr(model_args, key):
                raise ValueError(f"{key}={getattr(model_args, key)!r} applies to LoRA adapters: set lora true")
    if model_args and model_args.lora and model_args.lora_rank <= 0:
        raise ValueError(f"lora_rank must be positive, got {model_args.lora_rank}")
    if model_args and training_args and model_args.lora and training_args.tensor_parallel_degree > 1:
        raise ValueError(
            f"lora with tensor_parallel_degree={training_args.tensor_parallel_degree}: the tensor-parallel plan splits "
            "the base layers LoRA wraps; train LoRA adapters with data parallel or sharding stage1"
        )
    if data_args and training_args and bool(data_args.ptx_datasets) != (training_args.ptx_coeff > 0):
        raise ValueError(
            f"ptx_datasets={data_args.ptx_datasets!r} and ptx_coeff={training_args.ptx_coeff} go together: set both or neither"
        )
    if data_args and training_args and data_args.max_prompt_len + training_args.max_dec_len > data_args.max_length:
        raise ValueError(
            f"max_prompt_len={data_args.max_prompt_len} + max_dec_len={training_args.max_dec_len} exceeds "
            f"max_length={data_args.max_length}"
        )
