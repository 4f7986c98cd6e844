"""On-policy distillation end to end on the tiny world, with each distillation loss (reverse_kl on the sampled
tokens, gkd on the teacher's top tokens): a teacher of another size (3 layers, width 96, the student's
tokenizer) scores the student's samples. A teacher with distill_coeff 0 leaves GRPO's step exactly; pure
distillation (rl_algorithm on_policy_distill, no reward source) lowers the divergence; the step under tensor
or data parallel equals one process's; a decoupled sampler brings the teacher's log-probs of its batches; a resumed run
ends on the uninterrupted run's weights; a teacher with another tokenizer is refused."""

import os

import numpy as np
import pytest

from helpers import TINY_CONFIG, first_step, logged, overrides, run_grpo, weights
from llm.alignment.ppo import run_ppo
from llm.tools.build_tiny_model import build_tiny_model
from llm.tools.build_tokenizer import build_tokenizer

DISTILL = {"rl_algorithm": "on_policy_distill", "use_rule_reward": False, "kl_loss_coeff": 0.0, "eval_datasets": ""}
# The tiny vocabulary's 259 tokens: 8 of them and the rest, a top-k smaller than the vocabulary.
LOSSES = pytest.mark.parametrize("loss", [{"distill_loss": "reverse_kl"}, {"distill_loss": "gkd", "distill_topk": 8}],
                                 ids=["reverse_kl", "gkd"])


@pytest.fixture(scope="module")
def teacher(tiny_world, tmp_path_factory):
    """A random teacher of another size with the student's tokenizer (its folder holds it)."""
    path = str(tmp_path_factory.mktemp("teacher"))
    build_tiny_model(tiny_world["random_model"], path, hidden_size=96, num_layers=3, seed=1)
    return path


@LOSSES
def test_a_teacher_with_distill_coeff_zero_leaves_the_grpo_step_exactly(tiny_world, tmp_path, one_process_first_step, teacher, loss):
    grpo = one_process_first_step("grpo")
    measured = first_step(tiny_world, tmp_path, "teacher", processes=1, teacher_model_name_or_path=teacher, distill_coeff=0.0, **loss)
    for key in ("loss/policy_avg", "grad_norm", "entropy", "reward_mean", "policy/clipfrac_avg"):
        assert measured[key] == grpo[key], key
    assert measured["weights"] == grpo["weights"]
    assert measured["distill/reverse_kl"] > 0.1  # the teacher was measured: a random one is far from the student
    assert (measured.get("distill/divergence", 0) > 0) == (loss["distill_loss"] == "gkd")


@LOSSES
def test_pure_distillation_without_a_reward_source_lowers_the_reverse_kl(tiny_world, tmp_path, loss):
    """The untrained model learns from the fine-tuned one, with no reward: its samples' reverse KL to the
    teacher falls and the teacher likes them more."""
    run_grpo(tiny_world, tmp_path, actor_model_name_or_path=tiny_world["random_model"], teacher_model_name_or_path=tiny_world["model"],
             max_steps=8, learning_rate=1e-2, lr_scheduler_type="constant", save_steps=0, per_device_prompt_batch_size=8,
             rollout_n=8, per_device_train_batch_size=64, **DISTILL, **loss)
    reverse_kl = logged(tmp_path / "vdl", "train/distill/reverse_kl")
    teacher_logprobs = logged(tmp_path / "vdl", "train/distill/teacher_logprob_mean")
    assert len(reverse_kl) == 8 and len(teacher_logprobs) == 8
    assert np.mean(reverse_kl[-2:]) < 0.9 * np.mean(reverse_kl[:2]), reverse_kl
    assert np.mean(teacher_logprobs[-2:]) > np.mean(teacher_logprobs[:2]) + 0.8, teacher_logprobs
    assert not logged(tmp_path / "vdl", "train/accuracy")  # no reward source: nothing scored the samples
    if loss["distill_loss"] == "gkd":
        divergence = logged(tmp_path / "vdl", "train/distill/divergence")
        assert np.mean(divergence[-2:]) < 0.9 * np.mean(divergence[:2]), divergence


@pytest.mark.slow
@LOSSES
@pytest.mark.parametrize("layout", [{"data_ranks": 1, "tensor_parallel_degree": 2}, {}], ids=["tp2", "dp2"])
def test_the_distillation_step_over_two_processes_equals_one_process(tiny_world, tmp_path, teacher, loss, layout):
    """TP2 (the student and the teacher split over both ranks) and DP2 (each rank's half of the batch): the first
    step's loss, the distillation metrics and the weights equal one process's."""
    changes = {"teacher_model_name_or_path": teacher, "distill_coeff": 0.5, **loss}
    one = first_step(tiny_world, tmp_path, "one", processes=1, **changes)
    two = first_step(tiny_world, tmp_path, "two", processes=2, **layout, **changes)
    if layout:
        log = (tmp_path / "two_log" / "workerlog.0").read_text(errors="replace")
        assert log.count("tensor-parallel ranks") >= 2  # the student and the teacher are split
    keys = ["loss/policy_avg", "grad_norm", "distill/reverse_kl", "distill/teacher_logprob_mean"]
    for key in keys + (["distill/divergence", "loss/distill"] if loss["distill_loss"] == "gkd" else []):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    names = sorted(one["weights"])
    np.testing.assert_allclose([two["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=1e-5)


@pytest.mark.slow
@LOSSES
def test_a_decoupled_sampler_brings_the_teachers_log_probs_of_its_batches(tiny_world, tmp_path, teacher, loss):
    trainer = run_ppo.build_trainer(run_argv(tiny_world, tmp_path, teacher, rollout_mode="decoupled", max_steps=3, **loss))
    completed, complete = [], trainer.rollout.complete

    def keep(exp):
        brought = (exp.teacher_logprobs, exp.teacher_topk_logprobs, exp.teacher_topk_ids)
        exp = complete(exp)
        completed.append((exp, brought))
        return exp

    trainer.rollout.complete = keep
    trainer.train()
    assert len(completed) == 3
    worker = trainer.rollout.worker
    for exp, brought in completed:
        assert brought[0] is not None  # computed by the sampler, not again here
        here = worker.compute_logprobs(trainer.teacher_model, exp, worker.needs.teacher_topk)
        here = here if isinstance(here, tuple) else (here, None, None)
        assert (brought[1] is not None) == (loss["distill_loss"] == "gkd")
        for sampler, trainer_side in zip(brought, here):
            if sampler is not None:
                np.testing.assert_allclose(sampler.numpy(), trainer_side.numpy(), rtol=1e-5, atol=1e-5)


def run_argv(world, output_dir, teacher, **changes):
    return [TINY_CONFIG, *overrides(world, str(output_dir), teacher_model_name_or_path=teacher, save_steps=2,
                                    lr_scheduler_type="constant", **{**DISTILL, **changes})]


@LOSSES
def test_a_resumed_distillation_ends_on_the_uninterrupted_runs_weights(tiny_world, tmp_path, teacher, loss):
    """Two updates per batch (update_iters 2): the teacher's signal is taken at the behaviour policy's log-probs."""
    common = {"teacher_model_name_or_path": teacher, "max_steps": 4, "update_iters": 2, "save_steps": 2, **DISTILL, **loss}
    run_grpo(tiny_world, tmp_path / "straight", **common)
    run_grpo(tiny_world, tmp_path / "resumed", **common, resume_from_checkpoint=tmp_path / "straight" / "checkpoint-2")
    straight, resumed = weights(tmp_path / "straight" / "policy"), weights(tmp_path / "resumed" / "policy")
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tiny_world, tmp_path):
    tokenizer = str(tmp_path / "tool_tokenizer")
    build_tokenizer(tokenizer, tool_tags=True)
    other = str(tmp_path / "other_teacher")
    build_tiny_model(tokenizer, other, hidden_size=64, num_layers=2)
    with pytest.raises(ValueError) as refusal:
        run_grpo(tiny_world, tmp_path / "out", teacher_model_name_or_path=other, **DISTILL)
    message = str(refusal.value)
    assert f"the teacher's tokenizer ({other}" in message and f"is not the student's ({tiny_world['model']}" in message
    assert not os.path.isdir(tmp_path / "out" / "policy")
