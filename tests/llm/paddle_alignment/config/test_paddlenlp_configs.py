"""PaddleNLP's own RL and reward-model configs run here unchanged but for device, degrees and sizes
(tests/llm/paddle_alignment/config/paddlenlp_configs, JSON and YAML), 2 steps each on the tiny world, with paths given on the command
line as a user gives them; and PaddleNLP's key meanings (batch keys, switches, defaults) at parse time."""

import json
import os
import shutil

import pytest

from helpers import paddlenlp_messages, protocol_only_app, running_reward_server, serving
from llm.alignment.dpo import run_dpo
from llm.alignment.kto import run_kto
from llm.alignment.ppo import run_ppo
from llm.alignment.rm import run_reward
from paddle_alignment.config.arguments import parse_arguments

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paddlenlp_configs")


def config(name):
    return os.path.join(CONFIGS, name)


def local_paths(world, output_dir, **changes):
    """The command-line paths (and the eval size) a user points PaddleNLP's config at."""
    values = {
        "actor_model_name_or_path": world["model"],
        "train_datasets": world["train"],
        "eval_datasets": world["eval"],
        "output_dir": str(output_dir),
        "logging_dir": os.path.join(str(output_dir), "vdl"),
        "max_eval_samples": 8,
        **changes,
    }
    return [token for key, value in values.items() for token in (f"--{key}", str(value))]


def finished_steps(output_dir, step):
    return json.loads((output_dir / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"]


def pdopt_files(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith((".pdopt", "scheduler.pdparams")))


@pytest.mark.slow
def test_qwen_grpo_json_runs_against_a_server_without_health_and_resumes_without_optimizer_state(tiny_world, tmp_path):
    out = tmp_path / "run"
    with serving(protocol_only_app) as url, paddlenlp_messages() as lines:
        run_ppo.main([config("qwen_grpo_argument.json"), *local_paths(tiny_world, out, reward_server=url)])
    assert finished_steps(out, 2) == 2 and (out / "policy" / "config.json").is_file()
    # ignore_save_lr_and_optim: checkpoints hold the models and the run's state, not the optimizer.
    assert pdopt_files(out / "checkpoint-1") == [] and (out / "checkpoint-1" / "policy").is_dir()
    assert json.loads((out / "eval_results.json").read_text())["eval_reward_mean"] >= 0.0
    expected = [
        "normalize_reward=True has no effect with rl_algorithm=grpo",
        "ptx_coeff=16.0 has no effect without ptx_datasets",
        "use_flash_attention=True has no effect on CPU",
        "config key tensor_parallel_output=0 has no effect here",
        "has no GET /health (as PaddleNLP's) and reward_task is unset",
    ]
    for text in expected:
        assert any(text in line for line in lines), text

    # A crash after checkpoint-1: the same command resumes there, the optimizer restarting from zero
    # moments, and ends at step 2 again.
    shutil.rmtree(out / "checkpoint-2")
    shutil.rmtree(out / "policy")
    with serving(protocol_only_app) as url, paddlenlp_messages() as lines:
        run_ppo.main([config("qwen_grpo_argument.json"), *local_paths(tiny_world, out, reward_server=url)])
    assert finished_steps(out, 2) == 2 and (out / "policy" / "config.json").is_file()
    assert any("optimizer starts with zero moments" in line for line in lines)


@pytest.mark.slow
def test_llama_ppo_json_with_reward_model_ptx_and_no_evaluation(tiny_world, tiny_reward_model, tmp_path):
    reward_model, _ = tiny_reward_model
    argv = local_paths(tiny_world, tmp_path, reward_model_name_or_path=reward_model, ptx_datasets=tiny_world["sft_train"])
    run_ppo.main([config("llama_ppo_argument.json"), *argv])
    assert finished_steps(tmp_path, 2) == 2
    assert (tmp_path / "policy" / "config.json").is_file() and (tmp_path / "value" / "config.json").is_file()
    # evaluation_strategy "no" and do_eval 0: PaddleNLP evaluates nothing, neither does this run.
    assert not (tmp_path / "eval_results.json").exists()
    assert pdopt_files(tmp_path / "checkpoint-2") == ["optimizer.pdopt", "scheduler.pdparams", "value_optimizer.pdopt", "value_scheduler.pdparams"]


@pytest.mark.slow
def test_llama_rm_json_trains_a_reward_model(tiny_world, tmp_path):
    argv = [
        "--model_name_or_path", tiny_world["model"], "--train_datasets", tiny_world["pref_train"],
        "--eval_datasets", tiny_world["pref_eval"], "--output_dir", str(tmp_path), "--logging_dir", str(tmp_path / "vdl"),
    ]
    run_reward.main([config("llama_rm_argument.json"), *argv])
    assert (tmp_path / "config.json").is_file()
    assert "eval_accuracy" in json.loads((tmp_path / "all_results.json").read_text())


def preference_paths(world, output_dir, kind):
    return ["--model_name_or_path", world["model"], "--train_dataset_path", world[f"{kind}_train"],
            "--dev_dataset_path", world[f"{kind}_eval"], "--output_dir", str(output_dir), "--logging_dir", str(output_dir / "vdl")]


@pytest.mark.parametrize("name, main, kind", [
    ("qwen_dpo_argument.json", run_dpo.main, "dpo"),
    ("qwen_dpo_lora_argument.json", run_dpo.main, "dpo"),
    ("qwen_kto_argument.json", run_kto.main, "kto"),
])
def test_qwen_dpo_and_kto_json_train_evaluate_and_keep_the_best_checkpoint(tiny_world, tmp_path, name, main, kind):
    with paddlenlp_messages() as lines:
        main([config(name), *preference_paths(tiny_world, tmp_path, kind)])
    assert finished_steps(tmp_path, 2) == 2
    assert "eval_rewards/chosen" in json.loads((tmp_path / "eval_results.json").read_text())
    trained = "lora_config.json" if "lora" in name else "config.json"
    assert (tmp_path / trained).is_file()
    assert any("use_flash_attention=True has no effect on CPU" in line for line in lines)
    assert any("config key flash_mask=" in line for line in lines) == ("flash_mask" in open(config(name)).read())


@pytest.mark.slow
def test_qwen_grpo_yaml_with_global_batch_keys_and_rollout_micro_batches(tiny_world, tmp_path):
    with running_reward_server("arith") as url:
        run_ppo.main([config("qwen_grpo_argument.yaml"), *local_paths(tiny_world, tmp_path, reward_server=url)])
    assert finished_steps(tmp_path, 2) == 2
    # The server's /health names its task: accuracy is measured.
    assert "eval_accuracy" in json.loads((tmp_path / "eval_results.json").read_text())


@pytest.mark.slow
def test_qwen_ppo_yaml_runs_its_epochs_with_the_gsm8k_rule_and_a_critic(tiny_world, tmp_path):
    # max_steps -1 and num_train_epochs 1 over 8 prompts in batches of 4: 2 steps.
    rows = open(tiny_world["train"]).read().splitlines()[:8]
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    argv = local_paths(tiny_world, out, train_datasets=train, critic_model_name_or_path=tiny_world["model"])
    with paddlenlp_messages() as lines:
        run_ppo.main([config("qwen_ppo_argument.yaml"), *argv])
    assert finished_steps(out, 2) == 2 and not (out / "checkpoint-3").exists()
    assert (out / "value" / "config.json").is_file()
    assert any("1.0 epoch(s) of 2 steps = 2 steps" in line for line in lines)
    assert any("scores with the math rule" in line for line in lines)


@pytest.mark.slow
def test_qwen_reinforce_plus_plus_yaml_runs(tiny_world, tmp_path):
    with running_reward_server("arith") as url:
        run_ppo.main([config("qwen_reinforce_plus_plus_argument.yaml"), *local_paths(tiny_world, tmp_path, reward_server=url)])
    assert finished_steps(tmp_path, 2) == 2 and (tmp_path / "policy" / "config.json").is_file()


# ---- PaddleNLP's meanings at parse time ------------------------------------------------------------------


def parse(name, *overrides):
    return parse_arguments([config(name), *overrides])


def test_global_batch_keys_set_the_per_rank_prompts_and_accumulation_as_paddlenlp_does():
    _, data_args, args = parse("qwen_grpo_argument.yaml")
    # 4 prompts per step over 1 data rank; a mini-batch of 2 prompts x rollout_n 4 = 8 responses = 2
    # micro-batches of 4: gradient_accumulation_steps 2, so 2 optimizer steps per RL step.
    assert (args.per_device_prompt_batch_size, args.gradient_accumulation_steps, args.optimizer_steps_per_rl_step) == (4, 2, 2)
    assert (args.per_device_rollout_batch_size, args.per_device_logprob_batch_size) == (2, 4)
    assert (args.normalize_reward, args.normalize_advantage) == (False, False)  # grpo
    assert data_args.label_key == "tgt" and args.sharding in ("", []) and not args.sequence_parallel
    _, _, args = parse("qwen_reinforce_plus_plus_argument.yaml")
    # global_mini_batch_size -1 is the whole batch: one optimizer step per RL step.
    assert (args.gradient_accumulation_steps, args.optimizer_steps_per_rl_step) == (4, 1)
    assert args.per_device_value_batch_size == 8 and args.dataloader_shuffle is False


def test_conflicting_batch_keys_stop_the_run_naming_both():
    with pytest.raises(ValueError, match="per_device_prompt_batch_size=2 contradicts global_batch_size=4"):
        parse("qwen_grpo_argument.yaml", "--per_device_prompt_batch_size", "2")
    with pytest.raises(ValueError, match="gradient_accumulation_steps=3 contradicts global_mini_batch_size=2"):
        parse("qwen_grpo_argument.yaml", "--gradient_accumulation_steps", "3")


def test_paddlenlp_defaults_and_switches(tmp_path):
    minimal = tmp_path / "minimal.yaml"
    minimal.write_text("actor_model_name_or_path: m\ntrain_datasets: d.jsonl\noutput_dir: o\nuse_rule_reward: true\n")
    _, data_args, args = parse_arguments([str(minimal), "--device", "cpu", "--max_steps", "1"])
    assert (args.rl_algorithm, args.kl_coeff, args.clip_range_score, args.rollout_n) == ("ppo", 0.02, 10.0, 1)
    assert (args.per_device_prompt_batch_size, data_args.max_prompt_len, args.reward_task) == (16, 2048 - 512, "math")
    assert (args.dynamic_sampling, args.max_gen_batches, args.enable_overlong_reward_buffer, args.overlong_reward_buffer) == (False, 32, False, 256)
    _, _, args = parse_arguments([str(minimal), "--device", "cpu", "--max_steps", "1", "--offload_optim", "true", "--autotuner_benchmark", "true"])
    assert "optimizer" in args.offload_level.split()
    assert (args.max_steps, args.min_dec_len, args.save_strategy, args.evaluation_strategy) == (5, args.max_dec_len, "no", "no")


def test_yaml_errors_name_the_file(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("rl_algorithm: [grpo\n")
    with pytest.raises(ValueError, match="broken.yaml is not valid YAML"):
        parse_arguments([str(broken)])
    listed = tmp_path / "list.yaml"
    listed.write_text("- rl_algorithm\n")
    with pytest.raises(ValueError, match="must hold a mapping of keys to values"):
        parse_arguments([str(listed)])


def test_interval_strategies_name_the_steps_that_save_or_evaluate():
    from types import SimpleNamespace

    from llm.alignment.ppo.ppo_trainer import PPOTrainer

    trainer = SimpleNamespace(args=SimpleNamespace(max_steps=12), steps_per_epoch=lambda: 5)
    due = {
        strategy: [step for step in range(1, 13) if PPOTrainer.is_interval_step(trainer, strategy, 4, step)]
        for strategy in ("steps", "epoch", "no")
    }
    # The last step is never an interval step: the run saves and evaluates at its end anyway.
    assert due == {"steps": [4, 8], "epoch": [5, 10], "no": []}
    assert not any(PPOTrainer.is_interval_step(trainer, "steps", None, step) for step in range(1, 13))
