"""Arguments of RL alignment, read from one JSON or YAML file with PaddleNLP's `PdArgumentParser`.

Keys, meanings and defaults follow PaddleNLP's RL arguments (`paddlenlp/rl/utils/config_utils.py`), so
its configs run here unchanged; its keys that change nothing here are accepted with a log line saying
why (paddlenlp_keys.py). The training keys are grouped by concern (batch sizes, rollout, algorithm,
schedule, reward, distillation, critic, decoupled rollout, memory layout, logging, model kernels), each group a dataclass
in a module of this package (batch.py, rollout.py, algorithm.py, reward.py, distillation.py, critic.py, multi_turn.py,
decoupled.py, layout.py, run.py; the model and data keys in model.py) that validates its own keys;
`RLTrainingArguments` here joins them with paddlenlp's TrainingArguments into one flat set of keys. Everything is checked at start: unknown keys and impossible combinations stop the run
with a message naming the key. docs/configuration.md is generated from the help strings here
(`python -m llm.tools.config_reference`)."""

import dataclasses
import difflib
from dataclasses import dataclass

from paddlenlp.trainer import PdArgumentParser, TrainingArguments
from paddlenlp.utils.log import logger

from paddle_alignment.algos import ADVANTAGE_ESTIMATORS
from paddle_alignment.config.algorithm import AlgorithmArguments, ScheduleArguments
from paddle_alignment.config.batch import BatchSizeArguments
from paddle_alignment.config.checks import check_non_negative
from paddle_alignment.config.critic import CriticArguments
from paddle_alignment.config.decoupled import DecoupledRolloutArguments
from paddle_alignment.config.distillation import DistillationArguments
from paddle_alignment.config.layout import ModelKernelArguments, ParallelLayoutArguments
from paddle_alignment.config.model import DataArgument, ModelArgument
from paddle_alignment.config.multi_turn import MultiTurnArguments
from paddle_alignment.config.paddlenlp_keys import canonical_options, config_tokens, drop_keys_without_effect, read_config, split_options
from paddle_alignment.config.reward import JudgeArguments, RewardArguments
from paddle_alignment.config.rollout import RolloutArguments
from paddle_alignment.config.run import LoggingArguments, WatchdogArguments
from paddle_alignment.distributed import rendezvous_each_gloo_group_apart


@dataclass
class RLTrainingArguments(
    BatchSizeArguments, RolloutArguments, AlgorithmArguments, ScheduleArguments, RewardArguments, JudgeArguments,
    DistillationArguments, CriticArguments, MultiTurnArguments, DecoupledRolloutArguments, ParallelLayoutArguments, LoggingArguments,
    WatchdogArguments, ModelKernelArguments, TrainingArguments,
):
    """The training arguments of run_ppo: paddlenlp's TrainingArguments and the groups above, as one flat set of
    keys (PaddleNLP's configs keep parsing); each group validates its own keys."""

    def __post_init__(self):
        # As written: paddlenlp's post-init turns any evaluation_strategy into do_eval.
        self.evaluation_only = bool(self.do_eval and not self.do_train)
        self.apply_paddlenlp_switches()
        self.validate_scale_out()
        # paddlenlp sets the eval batch to the pipeline's micro-batches under pipeline parallel; RL evaluates by
        # decoding on the whole models, with the batch the config gives.
        eval_batch_size = self.per_device_eval_batch_size
        super().__post_init__()
        self.per_device_eval_batch_size = eval_batch_size
        self.lr_scheduler_type = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
        self.critic_lr_scheduler_type = getattr(self.critic_lr_scheduler_type, "value", self.critic_lr_scheduler_type)
        self.evaluation_strategy = getattr(self.evaluation_strategy, "value", self.evaluation_strategy)
        self.save_strategy = getattr(self.save_strategy, "value", self.save_strategy)
        self.resolve_batch_sizes()
        self.validate_algorithm()
        self.validate_rollout()
        self.validate_reward()
        self.validate_judge()
        self.validate_distillation()
        self.validate_critic()
        self.validate_run()
        self.validate_schedule()
        self.validate_batch_sizes()
        self.validate_rollout_mode()
        self.validate_watchdog()
        self.validate_multi_turn()

    def apply_paddlenlp_switches(self):
        """PaddleNLP's keys that switch other keys: autotuner_benchmark, offload_optim, and grpo's reward and
        advantage normalisation (off: the group baseline normalises)."""
        if self.autotuner_benchmark:
            logger.info(
                "autotuner_benchmark: 5 steps of max_dec_len-token responses without evaluation, checkpoints or "
                "reports (PaddleNLP's benchmark run; the weights still load from their paths)"
            )
            self.max_steps, self.num_train_epochs, self.do_train, self.do_eval = 5, 1, True, False
            self.evaluation_only, self.evaluation_strategy, self.save_strategy = False, "no", "no"
            self.report_to, self.min_dec_len = ["none"], self.max_dec_len
        if self.offload_optim:
            self.offload_level = f"{self.offload_level} optimizer"
        if self.rl_algorithm == "grpo":
            for key in ("normalize_reward", "normalize_advantage"):
                if getattr(self, key):
                    logger.info(f"{key}=True has no effect with rl_algorithm=grpo: the group baseline normalises (as in PaddleNLP)")
                    setattr(self, key, False)

    def validate_run(self):
        """paddlenlp's keys as this trainer reads them."""
        positive = ["per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "sample_log_interval"]
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.max_steps <= 0 and not (self.max_steps == -1 and self.num_train_epochs > 0):
            raise ValueError(
                f"max_steps={self.max_steps}: give a positive max_steps, or max_steps -1 with num_train_epochs > 0 "
                "(the steps of that many passes over train_datasets)"
            )
        check_non_negative(self, [
            "save_steps", "eval_steps", "logging_steps", "save_total_limit", "num_sample_logs", "weight_decay",
            "max_grad_norm",
        ])


GROUPS = (
    BatchSizeArguments, RolloutArguments, AlgorithmArguments, ScheduleArguments, RewardArguments, JudgeArguments,
    DistillationArguments, CriticArguments, MultiTurnArguments, DecoupledRolloutArguments, ParallelLayoutArguments, LoggingArguments,
    WatchdogArguments, ModelKernelArguments,
)


ARGUMENT_CLASSES = (ModelArgument, DataArgument, RLTrainingArguments)


def parse_arguments(argv, argument_classes=ARGUMENT_CLASSES):
    """`argv` = [config.json or config.yaml, --key value ...]: the file first, command-line overrides after
    it. PaddleNLP's and PaddleFormers' other key names are mapped to this project's (ALIASES; two names of
    one key with different values in one source stop the run), its keys without effect here are logged
    and dropped (NO_EFFECT), and unknown keys stop the run naming the closest known key."""
    if not argv or not argv[0].endswith((".json", ".yaml", ".yml")):
        raise ValueError("usage: <script> CONFIG.json|CONFIG.yaml [--key value ...]")
    valid = {f.name for cls in argument_classes for f in dataclasses.fields(cls) if f.init}
    options = canonical_options(split_options(config_tokens(read_config(argv[0]))), f"config file {argv[0]}")
    options += canonical_options(split_options(list(argv[1:])), "the command line")
    options = drop_keys_without_effect(options, valid)
    for key, _ in options:
        if key not in valid:
            hint = difflib.get_close_matches(key, valid, n=1)
            raise ValueError(f"unknown config key {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
    tokens = [token for key, values in options for token in (f"--{key}", *values)]
    rendezvous_each_gloo_group_apart()  # before paddlenlp's arguments initialise fleet's groups
    parsed = PdArgumentParser(argument_classes).parse_args_into_dataclasses(args=tokens, look_for_args_file=False)
    validate_across(parsed, given=dict(options))
    return parsed


def validate_across(parsed, given=None):
    """Checks that involve keys of more than one argument class, or what the config wrote (`given`: key ->
    value tokens)."""
    given = given or {}
    model_args = next((a for a in parsed if isinstance(a, ModelArgument)), None)
    data_args = next((a for a in parsed if isinstance(a, DataArgument)), None)
    training_args = next((a for a in parsed if isinstance(a, RLTrainingArguments)), None)
    if model_args and training_args:
        sources = [training_args.use_rm_server, training_args.use_rule_reward, model_args.reward_model_name_or_path is not None,
                   training_args.uses_judge]
        sourceless = training_args.environment_paths or training_args.rl_algorithm == "on_policy_distill"
        if sum(sources) > 1 or (sum(sources) == 0 and not sourceless):
            raise ValueError(
                "set exactly one reward source: use_rm_server (reward server), use_rule_reward (in-process rule), "
                "reward_model_name_or_path (reward model) or a judge (judge_model_name_or_path or judge_server); with an "
                "environment, or with rl_algorithm on_policy_distill, none (the environment's returns are the scores; "
                "the teacher is the signal)"
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
    if data_args and training_args:
        check_ptx(data_args, training_args)
        fit_prompts(data_args, training_args)
    if model_args and data_args and training_args and training_args.pipeline_parallel_degree > 1:
        check_pipeline_training(model_args, data_args, training_args)
    if training_args:
        note_keys_without_effect(training_args, given, data_args)


def check_ptx(data_args, training_args):
    """ptx data needs its coefficient; a coefficient without data (PaddleNLP's GRPO config) does nothing."""
    if data_args.ptx_datasets and training_args.ptx_coeff <= 0:
        raise ValueError(f"ptx_datasets={data_args.ptx_datasets!r} needs ptx_coeff > 0, the weight of its loss")
    if training_args.ptx_coeff > 0 and not data_args.ptx_datasets:
        logger.info(f"ptx_coeff={training_args.ptx_coeff} has no effect without ptx_datasets")
        training_args.ptx_coeff = 0.0


def check_pipeline_training(model_args, data_args, training_args):
    """What the pipeline-parallel policy and value models do not train yet: LoRA adapters, the ptx loss and a
    distillation teacher."""
    degree = f"pipeline_parallel_degree={training_args.pipeline_parallel_degree}"
    if model_args.lora:
        raise ValueError(f"lora with {degree}: the pipeline stages train whole weights; train LoRA adapters with data parallel or sharding stage1")
    if data_args.ptx_datasets:
        raise ValueError(f"ptx_datasets with {degree}: the pipeline's loss is the policy objective alone; drop ptx_datasets or pipeline parallel")
    if training_args.uses_teacher:
        raise ValueError(f"teacher_model_name_or_path with {degree}: the pipeline's loss does not take the teacher's log-probs yet; distil with data or tensor parallel")
    logger.info(
        f"{degree}: the update runs micro-batches of per_device_train_batch_size rows at the batch's width, whole "
        "rows and whole logits on the last stage (use_dynamic_batch_size, share_prompt_forward and "
        "logprob_chunk_tokens apply to the no-gradient passes on the whole models)"
    )


def fit_prompts(data_args, training_args):
    """Prompts are cut to max_length - max_dec_len tokens when max_prompt_len leaves no room for a whole response."""
    room = data_args.max_length - training_args.max_dec_len
    if room <= 0:
        raise ValueError(f"max_dec_len={training_args.max_dec_len} leaves no room for a prompt in max_length={data_args.max_length}")
    if data_args.max_prompt_len > room:
        logger.info(
            f"max_prompt_len={data_args.max_prompt_len} + max_dec_len={training_args.max_dec_len} exceeds "
            f"max_length={data_args.max_length}: prompts are limited to {room} tokens"
        )
        data_args.max_prompt_len = room


def note_distillation_keys_without_effect(args, given):
    """A log line for each distillation key the config wrote that does nothing: any without a teacher, gkd's own
    with another distillation loss."""
    for key in ("distill_coeff", "distill_loss", "distill_beta", "distill_topk"):
        if key not in given:
            continue
        if not args.uses_teacher:
            logger.info(f"{key}={getattr(args, key)} has no effect without teacher_model_name_or_path")
        elif key in ("distill_beta", "distill_topk") and not args.teacher_topk:
            logger.info(f"{key}={getattr(args, key)} has no effect with distill_loss={args.distill_loss} (it sets gkd's divergence)")


def note_keys_without_effect(args, given, data_args):
    """One log line for each key the config wrote that its switch leaves without effect, and the
    conflicts between PaddleNLP's global batch keys and this project's per-rank ones."""
    switched = {
        "max_gen_batches": ("dynamic_sampling", args.dynamic_sampling),
        "global_gen_batch_size": ("dynamic_sampling", args.dynamic_sampling),
        "overlong_reward_buffer": ("enable_overlong_reward_buffer", args.enable_overlong_reward_buffer),
        "overlong_penalty_factor": ("enable_overlong_reward_buffer", args.enable_overlong_reward_buffer),
    }
    for key, (switch, on) in switched.items():
        if key in given and not on:
            logger.info(f"{key}={getattr(args, key)} has no effect without {switch}=True")
    if "kl_coeff" in given and args.kl_coeff > 0 and not ADVANTAGE_ESTIMATORS.traits(args.rl_algorithm).kl_in_reward:
        logger.warning(
            f"kl_coeff={args.kl_coeff} has no effect with rl_algorithm={args.rl_algorithm}: it puts a KL penalty in "
            "the token rewards of ppo and reinforce_plus_plus; use kl_loss_coeff for a KL loss"
        )
    note_distillation_keys_without_effect(args, given)
    if "num_train_epochs" in given and args.max_steps > 0:
        logger.info(f"max_steps={args.max_steps} sets the run's length; num_train_epochs={args.num_train_epochs} has no effect")
    if "eval_steps" in given and args.evaluation_strategy == "no" and data_args and data_args.eval_datasets:
        logger.info("evaluation_strategy is 'no' (PaddleNLP's default): eval_datasets are not evaluated; set evaluation_strategy steps")
    if "per_device_prompt_batch_size" in given and "global_batch_size" in given:
        written = int(given["per_device_prompt_batch_size"][0])
        if written != args.per_device_prompt_batch_size:
            raise ValueError(
                f"per_device_prompt_batch_size={written} contradicts global_batch_size={args.global_batch_size} over "
                f"{args.dataset_world_size} data-parallel ranks ({args.per_device_prompt_batch_size} per rank): give one of them"
            )
