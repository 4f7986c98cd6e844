"""Config validation: unknown keys and impossible combinations stop at start, naming the key."""

import glob
import json
import os
import re
from types import SimpleNamespace

import pytest
from paddlenlp.trainer.trainer_utils import ShardingOption

from helpers import REPO_ROOT, BASE, paddlenlp_messages, parse
from llm.alignment.dpo.run_dpo import ARGUMENT_CLASSES as DPO_ARGUMENTS
from llm.alignment.kto.run_kto import ARGUMENT_CLASSES as KTO_ARGUMENTS
from llm.alignment.rm.run_reward import ARGUMENT_CLASSES as REWARD_ARGUMENTS
from llm.run_finetune import ARGUMENT_CLASSES as FINETUNE_ARGUMENTS
from llm.tools.build_real_model import real_config
from paddle_alignment.config.arguments import ARGUMENT_CLASSES, check_pipeline_training, parse_arguments
from paddle_alignment.config.decoupled import DecoupledRolloutArguments
from paddle_alignment.config.layout import (
    check_parallel_degrees,
    check_pipeline_layout,
    check_rollout_layout,
    refuse_pipeline_parallel,
    rollout_split_degree,
)
from paddle_alignment.config.multi_turn import MultiTurnArguments
from paddle_alignment.config.paddlenlp_keys import canonical_options
from paddle_alignment.models.tensor_parallel import check_splittable
from paddle_alignment.pipeline_parallel import check_whole_micro_batches

def test_valid_config_parses_with_paddlenlp_keys(tmp_path):
    model_args, data_args, args = parse(tmp_path, clip_range_ratio=0.2, clip_range_ratio_high=0.28)
    assert model_args.actor_model_name_or_path == "unused-model-path"
    assert data_args.prompt_key == "src" and data_args.label_key == "tgt"
    assert (args.clip_range_ratio_low, args.clip_range_ratio_high) == (0.2, 0.28)
    # 8 responses in micro-batches of 4, one optimizer step per micro-batch
    assert args.rollout_batch_size == 8 and args.optimizer_steps_per_rl_step == 2


def test_num_return_sequences_is_an_alias_of_rollout_n(tmp_path):
    _, _, args = parse(tmp_path, rollout_n=None, num_return_sequences=8)
    assert args.rollout_n == 8


def test_paddleformers_names_of_the_parallel_degrees_are_aliases(tmp_path):
    # A PaddleFormers user's config parses: its Megatron-style names mean paddlenlp's degrees.
    names = ["tensor_model_parallel_size", "pipeline_model_parallel_size", "sharding_parallel_size", "sep_parallel_size", "context_parallel_size"]
    assert [key for key, _ in canonical_options([(name, ["1"]) for name in names], "test")] == [
        "tensor_parallel_degree", "pipeline_parallel_degree", "sharding_parallel_degree", "sep_parallel_degree", "context_parallel_degree"
    ]
    parse(tmp_path, **dict.fromkeys(names, 1))


@pytest.mark.parametrize(
    "alias, key, value, other", [("tensor_model_parallel_size", "tensor_parallel_degree", 1, 2), ("num_return_sequences", "rollout_n", 4, 8)]
)
def test_two_names_of_one_key_with_different_values_are_an_error_naming_both(tmp_path, alias, key, value, other):
    with pytest.raises(ValueError, match=f"{key}={other} and {alias}={value}, two names of {key}"):
        parse(tmp_path, **{key: other, alias: value})
    # The same value under both names is one setting; a file's value and the command line's are not a
    # conflict (the command line overrides, test_command_line_overrides_the_file).
    parse(tmp_path, **{key: value, alias: value})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, key: other}))
    parse_arguments([str(path), f"--{alias}", str(value)])


def test_command_line_overrides_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE))
    _, _, args = parse_arguments([str(path), "--max_steps", "7", "--num_return_sequences", "2"])
    assert args.max_steps == 7 and args.rollout_n == 2
    _, _, args = parse_arguments([str(path), "--max_steps=8", "--tools=", "--output_dir=out/a=b"])  # argparse's --key=value
    assert args.max_steps == 8 and args.tools == "" and args.output_dir == "out/a=b"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rollout_nn": 3}, "unknown config key 'rollout_nn'; did you mean 'rollout_n'"),
        ({"rollout_n": 1}, "rollout_n=1"),
        ({"max_dec_len": 32, "min_dec_len": 1}, "max_dec_len=32 leaves no room for a prompt in max_length=32"),
        ({"per_device_train_batch_size": 3}, "per_device_train_batch_size=3"),
        ({"gradient_accumulation_steps": 3}, "gradient_accumulation_steps=3"),
        ({"rl_algorithm": "dpo"}, "rl_algorithm='dpo' is not available"),
        ({"reward_model_name_or_path": "rm"}, "exactly one reward source"),
        ({"ptx_datasets": "alpaca"}, "ptx_datasets='alpaca' needs ptx_coeff > 0"),
        ({"lam": 1.5}, "lam must lie in"),
        ({"clip_range_value": -1.0}, "clip_range_value must be >= 0"),
        ({"dynamic_sampling": True, "rollout_n": 1, "rl_algorithm": "reinforce_plus_plus"}, "dynamic_sampling filters groups"),
        ({"critic_lr_scheduler_type": "poly"}, "critic_lr_scheduler_type='poly'"),
        ({"critic_min_learning_rate": 1.0}, "critic_min_learning_rate=1.0"),
        ({"rl_algorithm": "rloo", "rollout_n": 1}, "rollout_n=1: rloo compares samples"),
        ({"policy_loss": "dpo"}, "policy_loss='dpo'"),
        ({"entropy_coeff": -0.1}, "entropy_coeff must be >= 0"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"gamma": 0.0}, "gamma must lie in"),
        ({"enable_overlong_reward_buffer": True, "overlong_reward_buffer": 9}, "overlong_reward_buffer=9 must lie in"),
        ({"kl_coeff": -1.0}, "kl_coeff must be >= 0"),
        ({"kl_estimator": "k9"}, "kl_estimator='k9'"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode='sum'"),
        ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type='polynomial'"),
        ({"use_rm_server": True}, "exactly one reward source"),
        ({"use_rule_reward": False}, "exactly one reward source"),
        ({"reward_task": "chess"}, "reward_task='chess'"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": 0.0}, "temperature"),
        ({"min_dec_len": 9}, "min_dec_len=9"),
        ({"clip_range_ratio_low": 1.0}, "clip_range_ratio_low"),
        ({"min_learning_rate": 1.0}, "min_learning_rate=1.0"),
        ({"max_steps": -1, "num_train_epochs": 0}, "max_steps=-1: give a positive max_steps"),
        ({"max_steps": 0}, "max_steps=0: give a positive max_steps"),
        ({"critic_recompute_granularity": "half"}, "critic_recompute_granularity='half'"),
        ({"recompute_granularity": "all"}, "recompute_granularity='all'"),
        ({"offload_level": "freeze_model gpu_cache"}, "offload_level"),
        ({"lora_path": "adapters"}, "lora_path='adapters' applies to LoRA adapters: set lora true"),
        ({"lora_target_modules": ".*q_proj.*"}, "lora_target_modules='.\\*q_proj.\\*' applies to LoRA"),
        ({"lora": True, "lora_rank": 0}, "lora_rank must be positive"),
        ({"pipeline_parallel_degree": 2}, "pipeline_parallel_degree=2 = 2 ranks per data-parallel replica does not divide the 1"),
        ({"save_steps": -1}, "save_steps must be >= 0"),
        ({"eval_steps": -5}, "eval_steps must be >= 0"),
        ({"save_total_limit": -1}, "save_total_limit must be >= 0"),
        ({"learning_rate": -1e-3}, "learning_rate must be >= 0"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be >= 0"),
        ({"warmup_steps": -2}, "warmup_steps must be >= 0"),
        ({"num_sample_logs": -1}, "num_sample_logs must be >= 0"),
        ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size must be positive"),
        ({"reward_server_timeout": 0}, "reward_server_timeout must be positive"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c=1.0 must be > 1"),
        ({"max_eval_samples": -1}, "max_eval_samples must be >= 0"),
        ({"max_prompt_len": 0}, "max_prompt_len must be positive"),
        ({"rollout_correction": "tis"}, "rollout_correction='tis' is not available"),
        ({"rollout_is_threshold": 0}, "rollout_is_threshold must be > 0"),
        ({"rollout_is_threshold": 2.0, "rollout_is_threshold_lower": 3.0}, "rollout_is_threshold_lower=3.0 must lie in \\[0, rollout_is_threshold=2.0\\]"),
        ({"environment": "envs.Guess"}, "environment: 'envs.Guess' is not module:Class"),
        ({"environment": "envs:Guess", "tools": "tools:calc"}, "tools and environment together"),
        ({"environment": "envs:Guess", "turn_reward_discount": 0}, "turn_reward_discount must lie in \\(0, 1\\]"),
        ({"rl_algorithm": "on_policy_distill", "use_rule_reward": False}, "on_policy_distill learns from a teacher alone: set teacher_model_name_or_path"),
        ({"teacher_model_name_or_path": "teacher", "distill_loss": "forward"}, "distill_loss='forward' is not available"),
        ({"teacher_model_name_or_path": "teacher", "distill_coeff": -1.0}, "distill_coeff must be >= 0"),
    ],
)
def test_bad_configs_fail_naming_the_key(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        parse(tmp_path, **changes)


def test_pure_distillation_needs_no_reward_source(tmp_path):
    _, _, args = parse(tmp_path, use_rule_reward=False, rl_algorithm="on_policy_distill", teacher_model_name_or_path="teacher")
    assert args.uses_teacher and not (args.use_rule_reward or args.use_rm_server or args.uses_judge)


@pytest.mark.parametrize(
    "changes, line",
    [
        ({"distill_loss": "gkd"}, "distill_loss=gkd has no effect without teacher_model_name_or_path"),
        ({"teacher_model_name_or_path": "teacher", "distill_topk": 8}, "distill_topk=8 has no effect with distill_loss=reverse_kl"),
    ],
)
def test_distillation_keys_without_effect_say_so(tmp_path, changes, line):
    with paddlenlp_messages() as lines:
        parse(tmp_path, **changes)
    assert line in "\n".join(lines)


def test_a_distillation_teacher_under_pipeline_parallel_is_refused(tmp_path):
    model_args, data_args, args = parse(tmp_path, teacher_model_name_or_path="teacher")
    args.pipeline_parallel_degree = 2
    with pytest.raises(ValueError, match="teacher_model_name_or_path with pipeline_parallel_degree=2"):
        check_pipeline_training(model_args, data_args, args)


def test_an_environment_may_be_the_only_reward_source(tmp_path):
    _, _, args = parse(tmp_path, use_rule_reward=False, environment="envs:Guess")
    assert args.environment_paths == ["envs:Guess"] and args.multi_turn and not args.use_rule_reward



@pytest.mark.parametrize("sharding", ["stage3", [ShardingOption.FULL_SHARD], "stage2 stage3"])
def test_decoupled_rollout_refuses_weights_sharding_stage_3_slices(sharding):
    """The trainer publishes the policy's whole weights to its samplers, which stage 3 holds only in slices
    (a GPU layout: checked on the arguments as paddlenlp leaves them, string or ShardingOption list)."""
    args = SimpleNamespace(rollout_mode="decoupled", max_staleness=1, rollout_timeout=None, rollout_sync_tolerance=1e-3,
                           pipeline_parallel_degree=1, tensor_parallel_degree=1, sharding=sharding, rollout_devices="7",
                           sampler_devices=["7"], rollout_dir=None, output_dir="out")
    with pytest.raises(ValueError, match="rollout_mode=decoupled with sharding stage3: .* use sharding stage1 or stage2"):
        DecoupledRolloutArguments.validate_rollout_mode(args)
    args.tensor_parallel_degree = 2  # stage 3 runs as stage 1 under tensor parallel
    DecoupledRolloutArguments.validate_rollout_mode(args)
    assert args.rollout_dir == os.path.join("out", "rollout")


@pytest.mark.parametrize("turns", [{"tools": "paddle_alignment.agents.calculator:calc"}, {"environment": "paddle_alignment.agents.environments:Environment"}])
def test_multi_turn_rollouts_refuse_sharding_stage_3(turns):
    """Each rank's trajectories take their own number of turns, where every forward of a stage-3 model gathers
    its weights from all ranks."""
    args = MultiTurnArguments(**turns)
    args.sharding, args.tensor_parallel_degree = [ShardingOption.FULL_SHARD], 1
    with pytest.raises(ValueError, match="multi-turn rollouts\) with sharding stage3: .* use sharding stage1 or stage2"):
        args.validate_multi_turn()
    args.tensor_parallel_degree = 2  # stage 3 runs as stage 1 under tensor parallel
    args.validate_multi_turn()

def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        parse_arguments([str(tmp_path / "missing.json")])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_arguments([str(bad)])


SHIPPED_CONFIGS = sorted(glob.glob(os.path.join(REPO_ROOT, "config", "*", "*.json")))


@pytest.mark.parametrize("path, architecture", [
    ("config/qwen/grpo_7b_argument.json", "qwen2.5-7b"), ("config/llama/grpo_8b_argument.json", "llama-3.1-8b"),
])
def test_the_tensor_parallel_configs_split_their_models(path, architecture):
    """The 7-8B configs at PaddleNLP's TP4 x sharding 2: 4 divides their model's heads, key-value heads and
    MLP width (Qwen2.5-7B: 28, 4, 18944; Llama 3.1 8B: 32, 8, 14336)."""
    with open(os.path.join(REPO_ROOT, path)) as f:
        config = json.load(f)
    assert (config["tensor_parallel_degree"], config["sharding"], config["sharding_parallel_degree"]) == (4, "stage1", 2)
    check_splittable(real_config(architecture)[1], config["tensor_parallel_degree"])


# A single CPU process runs a GPU config's settings but its parallel layout, checked against 8 GPUs apart.
SINGLE_CPU_PROCESS = {
    "device": "cpu", "bf16": "false", "tensor_parallel_degree": "1", "sequence_parallel": "false", "sharding": "",
    "sharding_parallel_degree": "-1",
}


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: os.path.relpath(p, os.path.dirname(os.path.dirname(p))))
def test_every_shipped_config_parses(path):
    """Each config file is valid for its entry point, and a GPU config's parallel layout for 8 GPUs."""
    name = os.path.basename(path)
    prefixes = {"sft_": FINETUNE_ARGUMENTS, "rm_": REWARD_ARGUMENTS, "dpo_": DPO_ARGUMENTS, "kto_": KTO_ARGUMENTS}
    classes = next((c for prefix, c in prefixes.items() if name.startswith(prefix)), ARGUMENT_CLASSES)
    parsed = parse_arguments([path, *[t for key, value in SINGLE_CPU_PROCESS.items() for t in (f"--{key}", value)]], classes)
    assert len(parsed) == 3
    with open(path) as f:
        config = json.load(f)
    layout = {key: config.get(key, parsed[2].__dataclass_fields__[key].default) for key in SINGLE_CPU_PROCESS if key not in ("device", "bf16")}
    check_parallel_degrees(SimpleNamespace(pipeline_parallel_degree=config.get("pipeline_parallel_degree", -1), **layout), 8, True)


def pipeline_layout(**changes):
    return SimpleNamespace(**{"pipeline_parallel_degree": 2, "tensor_parallel_degree": -1, "sharding": "",
                              "pipeline_parallel_config": "", **changes})


def test_pipeline_parallel_refuses_sharding_which_its_stages_do_not_run_yet():
    with pytest.raises(ValueError, match="pipeline_parallel_degree=2 with sharding=stage1: pipeline stages run with data parallel only"):
        check_pipeline_layout(pipeline_layout(sharding="stage1"))


@pytest.mark.parametrize(
    "layout, degree",
    [
        ({"pipeline_parallel_degree": 2, "tensor_parallel_degree": 2, "eval_mode": "single"}, 1),
        ({"pipeline_parallel_degree": 2, "tensor_parallel_degree": 2, "eval_mode": "tensor_parallel"}, 4),
        ({"pipeline_parallel_degree": 4, "tensor_parallel_degree": -1, "eval_mode": "tensor_parallel"}, 4),
        ({"pipeline_parallel_degree": 1, "tensor_parallel_degree": 8, "eval_mode": "single"}, 8),
    ],
)
def test_the_rollout_models_split_over_what_eval_mode_and_the_layout_give(layout, degree):
    args = SimpleNamespace(rollout_tensor_parallel_degree=-1, **layout)
    check_rollout_layout(args)
    assert rollout_split_degree(args) == degree
    args.rollout_tensor_parallel_degree = degree
    check_rollout_layout(args)


def test_paddlenlps_empty_eval_mode_is_single_and_a_rollout_degree_the_layout_does_not_give_is_refused():
    args = SimpleNamespace(pipeline_parallel_degree=2, tensor_parallel_degree=2, eval_mode="", rollout_tensor_parallel_degree=-1)
    check_rollout_layout(args)
    assert args.eval_mode == "single"
    args.rollout_tensor_parallel_degree = 2
    with pytest.raises(ValueError, match=re.escape(
        "rollout_tensor_parallel_degree=2: the rollout's models split over 1 rank(s) in this layout (tensor_parallel_degree=2, "
        "pipeline_parallel_degree=2, eval_mode=single); give -1 or 1"
    )):
        check_rollout_layout(args)
    with pytest.raises(ValueError, match="eval_mode='sharded': choose from"):
        check_rollout_layout(SimpleNamespace(pipeline_parallel_degree=2, tensor_parallel_degree=1, eval_mode="sharded", rollout_tensor_parallel_degree=-1))


def test_pipeline_stages_exchange_each_micro_batchs_shapes_and_drop_options_the_rl_update_does_not_run():
    """RL micro-batches change width from step to step, so fleet must not cache the first one's shapes; loss
    scaling and communication-overlap options assume fleet steps the optimizer, which the RL update does itself."""
    args = pipeline_layout(pipeline_parallel_config="enable_delay_scale_loss disable_partial_send_recv")
    with paddlenlp_messages() as lines:
        check_pipeline_layout(args)
    assert args.pipeline_parallel_config == "disable_partial_send_recv disable_p2p_cache_shape"
    assert any(line.startswith("pipeline_parallel_config enable_delay_scale_loss has no effect") for line in lines), lines


@pytest.mark.parametrize(
    "model, data, message",
    [
        ({"lora": True}, {"ptx_datasets": ""}, "lora with pipeline_parallel_degree=2: the pipeline stages train whole weights"),
        ({"lora": False}, {"ptx_datasets": "ptx.jsonl"}, "ptx_datasets with pipeline_parallel_degree=2: the pipeline's loss is the policy objective alone"),
    ],
)
def test_pipeline_parallel_refuses_lora_and_the_ptx_loss_naming_the_keys(model, data, message):
    with pytest.raises(ValueError, match=message):
        check_pipeline_training(SimpleNamespace(**model), SimpleNamespace(**data), SimpleNamespace(pipeline_parallel_degree=2))


def test_entry_points_without_pipeline_parallel_refuse_it_naming_the_one_that_has_it():
    with pytest.raises(ValueError, match=r"pipeline_parallel_degree=4: this entry point does not run pipeline-parallel models yet \(run_ppo.py, run_finetune.py and run_reward.py do\)"):
        refuse_pipeline_parallel(SimpleNamespace(pipeline_parallel_degree=4))
    refuse_pipeline_parallel(SimpleNamespace(pipeline_parallel_degree=1))


def test_a_pipeline_step_of_accumulated_batches_needs_whole_batches_or_drop_last():
    """Under pipeline parallel with accumulation, a training set whose share per data rank ends on a short batch
    is refused naming dataloader_drop_last; whole batches, drop_last, no accumulation or no pipeline pass."""
    def args(**changes):
        return SimpleNamespace(**{"pipeline_parallel_degree": 2, "gradient_accumulation_steps": 2, "dataloader_drop_last": False,
                                  "dataset_world_size": 2, "per_device_train_batch_size": 16, **changes})

    with pytest.raises(ValueError, match=r"100 training rows over 2 data rank\(s\) end each epoch on a batch of 2 rows, short of "
                                         r"per_device_train_batch_size=16.*set dataloader_drop_last true"):
        check_whole_micro_batches(args(), 100)
    check_whole_micro_batches(args(), 96)
    for changes in ({"dataloader_drop_last": True}, {"gradient_accumulation_steps": 1}, {"pipeline_parallel_degree": 1}):
        check_whole_micro_batches(args(**changes), 100)
