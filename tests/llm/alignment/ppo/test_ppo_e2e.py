"""PPO with a critic end to end on the tiny config: reward-model rewards, TRL's metrics, policy and value
checkpoints, exact resume; and the other PPO-family options (ptx, missing-EOS penalty, dynamic sampling).
Also the tiny pipeline's reward-model stage, beside its PPO stage: the suite's workers take whole files, so
the demo's world and reward model both stages use are built once."""

import json
import os

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoModelForCausalLM

from helpers import REPO_ROOT, launch_two_processes, small_run_argv
from llm.alignment.ppo import run_ppo
from paddle_alignment.models.score_model import AutoModelForScore

PPO_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "ppo_argument.json")
RULE_REWARD_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")

TRL_METRICS = [
    "objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward", "objective/scores",
    "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg", "val/clipfrac_avg",
    "val/ratio", "val/ratio_var", "val/num_eos_tokens", "eps", "val/value_mean", "val/explained_variance",
]


def ppo_trainer(world, reward_model, output_dir, **changes):
    """run_ppo's trainer for the tiny world, scaled down: PPO with `reward_model`, or, when it is None, the
    arith rule reward (the GRPO config with rl_algorithm ppo unless `changes` say otherwise)."""
    config = PPO_CONFIG if reward_model else RULE_REWARD_CONFIG
    rule = {"use_rule_reward": True, "use_rm_server": False, "reward_task": "arith", "rl_algorithm": "ppo", "kl_coeff": 0.02}
    source = {"reward_model_name_or_path": reward_model} if reward_model else rule
    defaults = {**source, "per_device_eval_batch_size": 32, "eval_steps": 0, "save_steps": 2, "critic_warmup_ratio": 0.0}
    argv = small_run_argv(world, output_dir, **{**defaults, **changes})
    return run_ppo.build_trainer([config, *argv])


def record_logs(trainer):
    """Every dict the trainer logs (paddlenlp keeps no log history), in order."""
    records, log = [], trainer.log

    def recording_log(logs, **kwargs):
        records.append(dict(logs))
        return log(logs, **kwargs)

    trainer.log = recording_log
    return records


def state(model):
    return {name: value.numpy() for name, value in model.state_dict().items()}


def test_ppo_with_a_reward_model_and_critic(tiny_world, tiny_reward_model, tmp_path):
    trainer = ppo_trainer(tiny_world, tiny_reward_model[0], str(tmp_path))
    initial_critic = state(trainer.critic)
    records = record_logs(trainer)
    trainer.train()
    logged = {key for record in records for key in record}
    assert set(TRL_METRICS) <= logged, set(TRL_METRICS) - logged
    assert "eval_reward_mean" in logged and "eval_accuracy" not in logged  # a reward model has no max score

    # output_dir/policy and output_dir/value load with from_pretrained; both moved.
    policy = AutoModelForCausalLM.from_pretrained(str(tmp_path / "policy"))
    value = AutoModelForScore.from_pretrained(str(tmp_path / "value"))
    assert value.config.score_type == "critic" and not value.config.do_normalize
    assert any(not np.array_equal(a, initial_critic[k]) for k, a in state(value).items())
    assert all(np.isfinite(a).all() for a in state(policy).values())
    assert sorted(os.listdir(tmp_path / "checkpoint-3")) == [
        "data_state.json", "optimizer.pdopt", "policy", "rng_state.pth", "scheduler.pdparams", "trainer_state.json", "value",
        "value_optimizer.pdopt", "value_scheduler.pdparams",
    ]


def test_critic_starts_from_the_reward_model(tiny_world, tiny_reward_model, tmp_path):
    trainer = ppo_trainer(tiny_world, tiny_reward_model[0], str(tmp_path))
    reward_model = AutoModelForScore.from_pretrained(tiny_reward_model[0])
    for name, value in state(reward_model).items():
        np.testing.assert_array_equal(state(trainer.critic)[name], value, err_msg=name)


def test_ppo_resume_restores_policy_critic_optimizers_reward_normalizer_and_data(tiny_world, tiny_reward_model, tmp_path):
    # ptx draws its own batches, which resume replays too.
    common = {"max_steps": 4, "update_iters": 2, "normalize_reward": True, "ptx_datasets": tiny_world["sft_train"], "ptx_coeff": 0.5}
    straight = ppo_trainer(tiny_world, tiny_reward_model[0], str(tmp_path / "straight"), **common)
    straight.train()
    assert "reward_normalizer.pdparams" in os.listdir(tmp_path / "straight" / "checkpoint-2")
    resumed = ppo_trainer(
        tiny_world, tiny_reward_model[0], str(tmp_path / "resumed"), **common,
        resume_from_checkpoint=tmp_path / "straight" / "checkpoint-2",
    )
    resumed.train(resume_from_checkpoint=resumed.args.resume_from_checkpoint)
    for name in ["policy", "value"]:
        expected, got = state(getattr(straight, "model" if name == "policy" else "critic")), state(
            getattr(resumed, "model" if name == "policy" else "critic")
        )
        for key in expected:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6, err_msg=f"{name}.{key}")
    np.testing.assert_allclose(resumed.reward_normalizer.mean.numpy(), straight.reward_normalizer.mean.numpy(), rtol=1e-6)


def test_ppo_with_rule_reward_ptx_and_missing_eos_penalty(tiny_world, tmp_path):
    trainer = ppo_trainer(
        tiny_world, None, str(tmp_path), ptx_datasets=tiny_world["sft_train"],
        ptx_coeff=0.5, missing_eos_penalty=2.0, max_dec_len=2, save_steps=0, critic_recompute=True,
    )
    assert trainer.critic.backbone.enable_recompute
    records = record_logs(trainer)
    trainer.train()
    logged = {key for record in records for key in record}
    assert "loss/ptx" in logged and "accuracy" in logged and "eval_accuracy" in logged
    # The critic starts from the actor's backbone when there is no reward model.
    assert trainer.critic.config.score_type == "critic"


def test_dynamic_sampling_fills_the_batch_with_groups_that_carry_signal(tiny_world, tmp_path):
    trainer = ppo_trainer(
        tiny_world, None, str(tmp_path), rl_algorithm="grpo", dynamic_sampling=True, max_gen_batches=4, save_steps=0, kl_coeff=0.0,
    )
    batches = trainer.endless_batches("train", trainer.train_dataset, trainer.args.per_device_prompt_batch_size)
    trainer.prepare_training()
    exp, generation = trainer.make_experience(batches)
    assert len(exp) == trainer.args.rollout_batch_size
    groups = exp.rewards.numpy().reshape(-1, trainer.args.rollout_n)
    kept_share, taken = generation["dynamic_sampling/kept_group_frac"], generation["dynamic_sampling/gen_batches"]
    kept = int(round(kept_share * taken * trainer.args.per_device_prompt_batch_size))
    # Every group kept before the filler has rewards that differ; groups stay whole and apart.
    assert (groups[: min(kept, len(groups))].std(axis=1) > 0).all()
    blocks = exp.group_index.numpy().reshape(-1, trainer.args.rollout_n)
    assert (blocks == blocks[:, :1]).all() and len(set(blocks[:, 0])) == len(blocks)


@pytest.mark.slow
def test_reward_model_stage_of_the_tiny_pipeline_ranks_held_out_pairs(demo_reward_model):
    """Stage 2 of the README's tiny pipeline, as configured: on held-out prompts the right sum is scored
    above the wrong one at least 80% of the time (0.935 measured)."""
    metrics = demo_reward_model[1]
    assert metrics["eval_accuracy"] >= 0.8, metrics
    assert metrics["eval_reward_std"] > 0


@pytest.mark.slow
def test_ppo_stage_of_the_tiny_pipeline_raises_the_reward_models_score(demo_world, demo_reward_model, tmp_path):
    """Stage 3 of the README's tiny pipeline, shortened: PPO from the demo's SFT model with its reward model
    raises the greedy held-out score of that reward model."""
    trainer = ppo_trainer(
        demo_world, demo_reward_model[0], str(tmp_path), rollout_n=8, per_device_prompt_batch_size=8,
        per_device_train_batch_size=64, per_device_eval_batch_size=200, max_steps=40, save_steps=0,
        logging_steps=10, warmup_ratio=0.02, critic_warmup_ratio=0.02,
    )
    trainer.train()
    before = json.loads((tmp_path / "initial_eval_results.json").read_text())["eval_reward_mean"]
    after = json.loads((tmp_path / "eval_results.json").read_text())["eval_reward_mean"]
    assert after > before + 1.0, (before, after)


@pytest.mark.slow
def test_two_process_ppo_with_critic_and_reward_normalisation(tiny_world, tiny_reward_model, tmp_path):
    """Under gloo data parallel the critic's gradients are averaged and the reward statistics gathered over
    both ranks: rank 0's checkpoint holds one normalizer state that saw every rank's rewards."""
    argv = [
        "--actor_model_name_or_path", tiny_world["model"], "--reward_model_name_or_path", tiny_reward_model[0],
        "--train_datasets", tiny_world["train"], "--eval_datasets", tiny_world["eval"], "--max_eval_samples", "15",
        "--output_dir", str(tmp_path / "out"), "--logging_dir", str(tmp_path / "out" / "vdl"), "--rollout_n", "4",
        "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "8", "--max_steps", "2",
        "--save_steps", "2", "--eval_steps", "0", "--normalize_reward", "true",
    ]
    launch_two_processes(PPO_CONFIG, argv, tmp_path / "launch_log")
    assert AutoModelForScore.from_pretrained(str(tmp_path / "out" / "value")).config.score_type == "critic"
    normalizer = paddle.load(str(tmp_path / "out" / "checkpoint-2" / "reward_normalizer.pdparams"))
    # 2 steps x 2 ranks x 8 responses.
    assert float(normalizer["count"]) == 32
