"""Decoupled rollout (rollout_mode decoupled): sampler processes sample the next batches while the trainer
learns. The staleness bound, behaviour log-probs in the ratio, weight publishing that never shows a partial
file, faults on either side, exact resume, and every kind of run it must serve."""

import dataclasses
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoModelForCausalLM
from safetensors.numpy import load_file

from helpers import REPO_ROOT, TINY_CONFIG, assert_frozen_run_resumes_as_uninterrupted, built_paddlenlp_ops, launch_two_processes, overrides, running_reward_server
from helpers import weights as model_weights
from llm.alignment.ppo import run_ppo
from paddle_alignment.checkpoints import saving as checkpoint_io
from paddle_alignment.rollout import ColocatedRollout, sync_check, weights
from paddle_alignment.rollout.decode import ROLLOUT_OPS
from paddle_alignment.rollout.decoupled import process_alive, whole_model_argv
from paddle_alignment.rollout.worker import ExperienceNeeds, RolloutWorker

# A checkpoint every 2 steps, no evaluation, a learning rate that does not depend on max_steps.
QUICK = {"rollout_mode": "decoupled", "save_steps": 2, "eval_datasets": "", "lr_scheduler_type": "constant"}


def logged_metrics(trainer):
    """Wrap the trainer's `log` to keep every step's metrics: the returned list fills as it trains."""
    steps, log = [], trainer.log

    def keep(metrics, *args, **kwargs):
        if "staleness" in metrics:
            steps.append(dict(metrics))
        return log(metrics, *args, **kwargs)

    trainer.log = keep
    return steps


def train(world, output_dir, **changes):
    trainer = run_ppo.build_trainer([TINY_CONFIG, *overrides(world, str(output_dir), **{**QUICK, **changes})])
    steps = logged_metrics(trainer)
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    return trainer, steps


@pytest.mark.parametrize("max_staleness", [0, 2])
def test_batches_are_sampled_by_a_policy_at_most_max_staleness_steps_old(tiny_world, tmp_path, max_staleness):
    trainer, steps = train(tiny_world, tmp_path, max_steps=4, max_staleness=max_staleness, save_steps=0)
    # Step k trains on a batch requested max_staleness steps earlier, sampled by the policy of then (version 0 at
    # first); the trainer waits for batches, the sampler for work and weights, and both are logged.
    assert [m["staleness"] for m in steps] == [min(k - 1, max_staleness) for k in range(1, 5)]
    assert all(m["rollout_wait_s"] >= 0 and m["train_wait_s"] >= 0 for m in steps)
    # The samplers are gone and so are the published weights; the sampler's log stays.
    rollout_dir = tmp_path / "rollout"
    assert sorted(os.listdir(rollout_dir)) == ["sampler-0.log"]


class StaleRollout(ColocatedRollout):
    """The trainer's own rollouts, handed over as a hand-made stale batch: every other response scored
    correct, and behaviour log-probs that make the ratio 2 on correct responses and 1/2 on wrong ones."""

    def sample_next(self):
        super().sample_next()
        exp = self.ready[-1].exp
        exp.scores = paddle.to_tensor([1.0, 0.0] * (len(exp) // 2), dtype="float32")
        current = self.worker.compute_logprobs(self.worker.policy, exp)
        shift = paddle.where(exp.scores > 0, paddle.full_like(exp.scores, -np.log(2.0)), paddle.full_like(exp.scores, np.log(2.0)))
        exp.old_logprobs = current + shift.unsqueeze(-1)


def test_the_ratio_uses_the_behaviour_log_probs_a_stale_batch_brings(tiny_world, tmp_path):
    argv = overrides(tiny_world, str(tmp_path), max_steps=1, per_device_train_batch_size=16, kl_loss_coeff=0.0, eval_datasets="")
    trainer = run_ppo.build_trainer([TINY_CONFIG, *argv])
    trainer.rollout = StaleRollout(trainer.rollout.worker)
    trainer.prepare_training()
    batches = trainer.endless_batches("train", trainer.train_dataset, trainer.args.generation_batch_size)
    exp, metrics = trainer.rl_step(batches)

    # PPO's clip: ratios of 2 above 1 + clip_range_ratio_high count where the advantage is positive (a correct
    # response in a group with a wrong one), ratios of 1/2 below 1 - clip_range_ratio_low where it is negative.
    mask, advantages = exp.response_mask.numpy(), exp.advantages.numpy()
    correct = (exp.scores.numpy() > 0)[:, None]
    assert np.isclose(metrics["clipfrac_high"], (mask * correct * (advantages > 0)).sum() / mask.sum(), atol=1e-6)
    assert np.isclose(metrics["clipfrac_low"], (mask * ~correct * (advantages < 0)).sum() / mask.sum(), atol=1e-6)
    assert np.isclose(metrics["val/ratio"], (mask * np.where(correct, 2.0, 0.5)).sum() / mask.sum(), rtol=1e-4)
    assert metrics["clipfrac_low"] > 0.2 and metrics["clipfrac_high"] > 0.2


def test_the_sampler_records_the_behaviour_log_probs_a_forward_pass_gives(tiny_world, tmp_path):
    """The decode loop's log-probs as it samples (rollout_logprobs) and the trainer-style forward's (old_logprobs)
    both equal the trainer's forward to 1e-5 in float32: the rollout/trainer gap reads ~0 on the tiny world."""
    built_paddlenlp_ops(ROLLOUT_OPS)  # the fast decode loop records them as it samples
    argv = overrides(tiny_world, str(tmp_path), temperature=0.7, eval_datasets="", max_dec_len=6, min_dec_len=3)
    trainer = run_ppo.build_trainer([TINY_CONFIG, *argv])
    worker = trainer.rollout.worker
    worker.needs = ExperienceNeeds.for_sampler(trainer.args)  # what a sampler adds to its rollouts
    exp = worker.complete(worker.generate_sequences([trainer.train_dataset[i] for i in range(4)], seed=3)[0])
    forward = worker.compute_logprobs(trainer.model, exp).numpy()  # softmax(logits / 0.7), as the loss has it
    mask = exp.response_mask.numpy()
    assert mask.sum() > 16
    np.testing.assert_allclose(exp.rollout_logprobs.numpy() * mask, forward * mask, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(exp.old_logprobs.numpy() * mask, forward * mask, rtol=1e-5, atol=1e-5)


def version_model(version, size=64):
    """A model whose weights all hold `version`."""
    model = paddle.nn.Linear(size, size)
    for param in model.parameters():
        param.set_value(paddle.full(param.shape, float(version)))
    return model


def test_published_weights_are_never_seen_partly_written(tmp_path):
    seen, stop = [], threading.Event()

    def reader():  # reads every version it sees while versions are published, reused and removed, then the last
        while True:
            stopping = stop.is_set()  # one more look once the publishing ends: `keep=1` leaves the last version
            for name in os.listdir(tmp_path):
                match = weights.WEIGHTS_FILE.match(name)
                if not match:
                    continue
                version = int(match.group(1))
                try:
                    state = weights.read_version(str(tmp_path / name), version)
                except FileNotFoundError:  # expired between listing and opening
                    continue
                except RuntimeError as error:  # expired and reused while read: no request reads such a file
                    assert "was reused for policy version" in str(error)
                    continue
                seen.append(sorted(state) == ["bias", "weight"] and all((value == version).all() for value in state.values()))
            if stopping:
                return

    models = [version_model(version) for version in range(30)]
    thread = threading.Thread(target=reader)
    thread.start()
    for version, model in enumerate(models):
        weights.publish(weights.trained_state(model), str(tmp_path), version, keep=1)
    stop.set()
    thread.join()
    assert seen and all(seen)
    assert sorted(os.listdir(tmp_path)) == ["policy-v28.safetensors", "policy-v29.safetensors"]


def test_an_expired_file_is_reused_in_place_and_a_read_it_overtakes_fails(tmp_path, monkeypatch):
    folder = str(tmp_path)
    for version in range(3):
        weights.publish(weights.trained_state(version_model(version)), folder, version, keep=1)
        if version == 0:
            first_file = os.stat(weights.weights_path(folder, 0)).st_ino
    # Version 2 was written into version 0's file (expired: older than 2 - keep), and holds version 2.
    assert os.stat(weights.weights_path(folder, 2)).st_ino == first_file
    assert sorted(os.listdir(folder)) == ["policy-v1.safetensors", "policy-v2.safetensors"]
    state = weights.read_version(weights.weights_path(folder, 2), 2)
    assert all((value == 2).all() for value in state.values())
    # Another layout (a bigger model) is never written into an old file.
    weights.publish(weights.trained_state(version_model(3, size=8)), folder, 3, keep=0)
    assert os.stat(weights.weights_path(folder, 3)).st_ino != first_file
    assert weights.read_version(weights.weights_path(folder, 3), 3)["weight"].shape == (8, 8)

    # A sampler still reading version 3 when its file is reused for version 5 stops instead of mixing the two.
    class ReusedWhileRead:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def read(self):
            data = self.f.read()
            weights.publish(weights.trained_state(version_model(5, size=8)), folder, 5, keep=1)  # the trainer reuses the file meanwhile
            return data

    opened = open
    monkeypatch.setattr(weights, "open", lambda path, mode: ReusedWhileRead(opened(path, mode)) if mode == "rb" else opened(path, mode), raising=False)
    with pytest.raises(RuntimeError, match="reused for policy version 5 while this sampler read version 3"):
        weights.read_version(weights.weights_path(folder, 3), 3)


def test_a_failed_publish_leaves_no_file_under_the_version_name(tmp_path, monkeypatch):
    def failing_save(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(weights, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        weights.publish(weights.trained_state(version_model(30)), str(tmp_path), 30, keep=1)
    assert not os.path.exists(weights.weights_path(str(tmp_path), 30))
    with pytest.raises(TimeoutError, match="policy version 30 was not published"):
        weights.wait_and_load(version_model(0), str(tmp_path), 30, timeout=0.2, alive=lambda: True)


def test_bfloat16_weights_travel_exactly(tmp_path):
    published, received = paddle.nn.Linear(8, 4), paddle.nn.Linear(8, 4)
    published.to(dtype="bfloat16")
    received.to(dtype="bfloat16")
    weights.publish(weights.trained_state(published), str(tmp_path), 1, keep=0)
    weights.wait_and_load(received, str(tmp_path), 1, timeout=1, alive=lambda: True)
    assert received.weight.dtype == paddle.bfloat16
    for name, value in published.state_dict().items():
        np.testing.assert_array_equal(received.state_dict()[name].astype("float32").numpy(), value.astype("float32").numpy())


def test_weights_the_sampler_cannot_hold_stop_it_with_their_name(tmp_path):
    weights.publish(weights.trained_state(paddle.nn.Linear(8, 4)), str(tmp_path), 1, keep=0)
    shapes = r"other shapes than the sampler's policy: bias \[4\] \(the sampler's \[3\]\); weight \[8, 4\] \(the sampler's \[8, 3\]\)$"
    with pytest.raises(ValueError, match=shapes):
        weights.wait_and_load(paddle.nn.Linear(8, 3), str(tmp_path), 1, timeout=1, alive=lambda: True)
    with pytest.raises(KeyError, match=r"the sampler's policy lacks: \['bias'\]"):
        weights.wait_and_load(paddle.nn.Linear(8, 4, bias_attr=False), str(tmp_path), 1, timeout=1, alive=lambda: True)


def test_resume_after_a_crash_trains_exactly_as_an_uninterrupted_run(tiny_world, tmp_path, monkeypatch):
    train(tiny_world, tmp_path / "straight", max_steps=4)

    # A crash right after checkpoint-2, whose rollout queue holds the batch sampled for step 3.
    save = checkpoint_io.save_checkpoint

    def save_then_crash(run):
        save(run)
        raise KeyboardInterrupt("crash after the checkpoint")

    monkeypatch.setattr(checkpoint_io, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_world, tmp_path / "crashed", max_steps=4)
    monkeypatch.undo()
    assert "rollout_queue.rank0.pkl" in os.listdir(tmp_path / "crashed" / "checkpoint-2")
    with open(tmp_path / "crashed" / "checkpoint-2" / "rollout_queue.rank0.pkl", "rb") as f:
        assert [batch["version"] for batch in pickle.load(f)] == [1]

    # The same command again resumes there: same batches, same updates.
    _, steps = train(tiny_world, tmp_path / "crashed", max_steps=4)
    assert [m["staleness"] for m in steps] == [1, 1]
    resumed, straight = model_weights(tmp_path / "crashed" / "policy"), model_weights(tmp_path / "straight" / "policy")
    for name in straight:
        np.testing.assert_allclose(resumed[name], straight[name], rtol=1e-5, atol=1e-6, err_msg=name)


def run_in_background(world, output_dir, **changes):
    argv = overrides(world, str(output_dir), **{**QUICK, **changes})
    return subprocess.Popen(
        [sys.executable, os.path.join(REPO_ROOT, "llm", "alignment", "ppo", "run_ppo.py"), TINY_CONFIG, *argv],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_a_stalled_weight_publication_ends_the_run_naming_it_and_the_rerun_ends_as_an_uninterrupted_run(tiny_world, tmp_path):
    """Publishing policy version 3 blocks forever (tests/probes/frozen_run.py): the trainer's watchdog ends it
    within watchdog_timeout, naming the publication, the step and the last event; its sampler exits with it,
    and the same command resumes from checkpoint-2 and ends on the uninterrupted run's weights."""
    message = (rf"watchdog: weight publication did not finish within watchdog_timeout=3 s: policy version 3 into "
               rf"{tmp_path / 'out' / 'rollout'}; after RL step 3; the last event before it: RL step 3 done")
    assert_frozen_run_resumes_as_uninterrupted(
        tiny_world, tmp_path, "weight-publication:3", message, **{**QUICK, "max_steps": 6, "watchdog_timeout": 3}
    )


def sampler_pid(output_dir, timeout=120):
    path = output_dir / "rollout" / "sampler-0.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, "the sampler did not start"
        time.sleep(0.1)
    return json.loads(path.read_text())["pid"]


def test_a_killed_sampler_stops_the_trainer_with_a_message(tiny_world, tmp_path):
    trainer = run_in_background(tiny_world, tmp_path, max_steps=1000, save_steps=0)
    os.kill(sampler_pid(tmp_path), signal.SIGKILL)
    output, _ = trainer.communicate(timeout=60)
    assert trainer.returncode != 0
    assert "rollout sampler 0 exited" in output and "sampler-0.log" in output


def test_a_killed_trainer_takes_its_sampler_with_it(tiny_world, tmp_path):
    trainer = run_in_background(tiny_world, tmp_path, max_steps=1000, save_steps=0)
    pid = sampler_pid(tmp_path)
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE  # a CPU sampler takes only the cores the trainer leaves
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 10
    while process_alive(pid):
        assert time.monotonic() < deadline, "the sampler outlived its trainer"
        time.sleep(0.1)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"rl_algorithm": "ppo", "kl_coeff": 0.05}, id="ppo-critic-kl-in-reward"),
        pytest.param({"rl_algorithm": "reinforce_plus_plus", "kl_coeff": 0.05}, id="reinforce_plus_plus"),
        pytest.param({"lora": True, "lora_rank": 4, "kl_loss_coeff": 0.01, "learning_rate": 1e-3}, id="lora"),
        pytest.param({"dynamic_sampling": True, "max_gen_batches": 3}, id="dynamic-sampling"),
    ],
)
def test_every_kind_of_run_trains_with_decoupled_rollout(tiny_world, tmp_path, changes):
    trainer, steps = train(tiny_world, tmp_path, max_steps=3, save_steps=0, **changes)
    assert steps[0]["staleness"] == 0 and all(0 <= m["staleness"] <= 1 for m in steps)
    assert all(np.isfinite(m["loss/policy_avg"]) for m in steps)
    assert os.path.isdir(tmp_path / "policy")


@pytest.mark.parametrize(
    "changes", [pytest.param({}, id="whole-policy"), pytest.param({"lora": True, "lora_rank": 4, "learning_rate": 1e-3}, id="lora")]
)
def test_with_no_staleness_the_sampler_samples_with_the_policy_being_trained(tiny_world, tmp_path, changes):
    # max_staleness 0: step k's batch is sampled by version k - 1, the policy step k trains; with one update
    # over the whole batch every ratio pi_theta / pi_old is 1, unless the sampler holds other weights.
    built_paddlenlp_ops(ROLLOUT_OPS)  # behaviour log-probs from the fast decode loop, equal to a forward's
    _, steps = train(
        tiny_world, tmp_path, max_steps=3, max_staleness=0, save_steps=0, kl_loss_coeff=0.0, per_device_train_batch_size=16, **changes
    )
    assert [m["staleness"] for m in steps] == [0, 0, 0]
    for m in steps:
        assert abs(m["val/ratio"] - 1) < 1e-4 and m["val/ratio_var"] < 1e-8 and m["policy/clipfrac_avg"] == 0


def test_a_lora_policy_publishes_only_its_adapters(tiny_world, tmp_path):
    argv = overrides(tiny_world, str(tmp_path), lora=True, lora_rank=4, kl_loss_coeff=0.01, eval_datasets="")
    trainer = run_ppo.build_trainer([TINY_CONFIG, *argv])
    weights.publish(weights.trained_state(trainer.model), str(tmp_path), 0, keep=0)
    published = load_file(weights.weights_path(str(tmp_path), 0))
    assert published and all("lora_" in name for name in published)


def test_decoupled_rollout_scores_through_the_reward_server(tiny_world, tmp_path):
    with running_reward_server("arith") as url:
        _, steps = train(tiny_world, tmp_path, max_steps=2, save_steps=0, use_rm_server=True, use_rule_reward=False, reward_server=url)
    assert len(steps) == 2 and all(0 <= m["reward_mean"] <= 1 for m in steps)


@pytest.mark.slow
def test_two_data_parallel_trainers_share_one_sampler(tiny_world, tmp_path):
    argv = overrides(tiny_world, str(tmp_path), **{**QUICK, "max_steps": 3, "save_steps": 0})
    logs = launch_two_processes(TINY_CONFIG, argv, tmp_path / "launch")
    assert all("staleness: 1.0" in log for log in logs.values())
    assert os.path.isdir(tmp_path / "policy")


def sync_pair(tiny_world, tmp_path):
    """The trainer's rollout worker, and a sampler's over its own copy of the same model."""
    argv = overrides(tiny_world, str(tmp_path / "run"), temperature=0.7, eval_datasets="", rollout_sync_tolerance=1e-4)
    trainer = run_ppo.build_trainer([TINY_CONFIG, *argv])
    sampler_policy = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    sampler = RolloutWorker(trainer.args, sampler_policy, trainer.tokenizer, reward_scorer=None)
    return trainer.rollout.worker, sampler


def train_one_parameter(policy, name):
    """A stand-in for an optimizer step: one parameter of the trainer's policy moves."""
    param = dict(policy.named_parameters())[name]
    param.set_value(param + 0.05 * paddle.randn(param.shape))


def test_every_weight_sync_is_checked_against_the_trainers_log_probs(tiny_world, tmp_path, monkeypatch):
    built_paddlenlp_ops(ROLLOUT_OPS)
    trainer, sampler = sync_pair(tiny_world, tmp_path)
    folder, moved = str(tmp_path / "rollout"), "qwen2.layers.1.mlp.down_proj.weight"
    os.makedirs(folder)
    trainer.publish_weights(folder, 0, keep=0)
    sampler.update_weights(folder, 0, 1, lambda: True, "rollout sampler 0 (cpu)")  # the same weights: it passes

    train_one_parameter(trainer.policy, moved)
    trainer.publish_weights(folder, 1, keep=1)
    sampler.update_weights(folder, 1, 1, lambda: True, "rollout sampler 0 (cpu)")  # loaded: the same again

    # A sampler whose model never takes the weights (verl #7495's adapter) samples with version 1 as version 2.
    train_one_parameter(trainer.policy, moved)
    trainer.publish_weights(folder, 2, keep=1)
    monkeypatch.setattr(weights, "assign", lambda model, state, path: None)
    message = (r"weight sync check failed: rollout sampler 0 \(cpu\) loaded policy version 2, but its probe log-probs "
               rf"differ from the trainer's by up to .* \(rollout_sync_tolerance 0.0001\); the parameter that differs most: {moved} ")
    with pytest.raises(RuntimeError, match=message):
        sampler.update_weights(folder, 2, 1, lambda: True, "rollout sampler 0 (cpu)")


def test_the_native_probe_gives_the_log_probs_of_the_models_own_forward(tiny_world, tmp_path):
    """The probe through the native op (its inputs made once, its log-softmax on the host) equals the model's own
    forward through the behaviour log-prob pass, at the sampling temperature, call after call."""
    built_paddlenlp_ops(ROLLOUT_OPS)
    trainer, _ = sync_pair(tiny_world, tmp_path)
    policy = trainer.policy
    with paddle.no_grad():
        expected = trainer.batch_logprobs(policy, None, sync_check.probe_batch(policy.config.vocab_size)).numpy()
        probes = [sync_check.probe_logprobs(trainer) for _ in range(2)]
    assert policy in sync_check.NATIVE_PROBES and expected.shape == (sync_check.PROBE_ROWS, sync_check.PROBE_RESPONSE_TOKENS)
    for probe in probes:
        np.testing.assert_allclose(probe, expected, rtol=0, atol=1e-5)
    assert np.abs(expected).min() > 1e-3  # real log-probs of random tokens, not zeros


def test_a_frozen_parameter_that_differs_is_named_against_the_trainers_digest(tiny_world, tmp_path):
    """A parameter the trainer does not train (a LoRA policy's base weights) is not published: the sampler's own
    copy of it is compared with the digest the trainer recorded once."""
    built_paddlenlp_ops(ROLLOUT_OPS)
    trainer, sampler = sync_pair(tiny_world, tmp_path)
    folder, frozen = str(tmp_path / "rollout"), "qwen2.layers.0.mlp.up_proj.weight"
    os.makedirs(folder)
    dict(trainer.policy.named_parameters())[frozen].stop_gradient = True
    trainer.publish_weights(folder, 0, keep=0)
    train_one_parameter(sampler.policy, frozen)  # the sampler's base weights are not the trainer's
    message = rf"the parameter that differs most: {frozen} \(frozen: sum .*; the trainer's .*\)$"
    with pytest.raises(RuntimeError, match=message):
        sampler.update_weights(folder, 0, 1, lambda: True, "rollout sampler 0 (cpu)")


def test_the_digest_sums_bfloat16_values_not_their_bits():
    values = [1.5, -2.25, 3.0]
    digests = [sync_check.parameter_digest([("w", paddle.to_tensor(values, dtype=dtype))]) for dtype in ("bfloat16", "float32")]
    np.testing.assert_array_equal(digests[0], [[2.25, 1.5**2 + 2.25**2 + 3.0**2]])
    np.testing.assert_array_equal(digests[0], digests[1])


def test_equal_weights_that_compute_otherwise_are_said_to(tiny_world, tmp_path):
    """Every parameter the trainer's, the log-probs still apart (here the sampler computes at another
    temperature; on GPUs, another precision): the message says the passes differ, not the weights."""
    trainer, sampler = sync_pair(tiny_world, tmp_path)
    folder = str(tmp_path / "rollout")
    os.makedirs(folder)
    trainer.publish_weights(folder, 0, keep=0)
    sampler.sampling = dataclasses.replace(sampler.sampling, temperature=1.3)
    with pytest.raises(RuntimeError, match="yet every parameter equals the trainer's: the two passes compute differently"):
        sampler.update_weights(folder, 0, 1, lambda: True, "rollout sampler 0 (cpu)")


def test_a_version_published_without_the_check_is_refused(tiny_world, tmp_path):
    trainer, sampler = sync_pair(tiny_world, tmp_path)
    weights.publish(weights.trained_state(trainer.policy), str(tmp_path), 3, keep=0)  # no check arrays
    with pytest.raises(RuntimeError, match="policy version 3 .* was published without the weight-sync check's arrays"):
        sampler.update_weights(str(tmp_path), 3, 1, lambda: True, "rollout sampler 0 (cpu)")


def test_a_frozen_sampler_ends_the_run_within_its_deadline_and_the_rerun_ends_as_an_uninterrupted_run(tiny_world, tmp_path):
    """The trainer stops its sampler (SIGSTOP) once checkpoint-2 is written (tests/probes/frozen_run.py); at the
    default settings it stops within 10 x its slowest step (at least a minute), naming the sampler, the
    versions and the sampler's last event; the same command resumes and ends on the uninterrupted run's
    weights."""
    message = (r"rollout sampler 0 sent no batch within (\d+) s \(10 x the slowest RL step so far, ([0-9.]+) s, and at "
               r"least 60 s; rollout_timeout sets it\): the trainer, at policy version \d+, waits for the batch of "
               r"policy version \d+")
    run = assert_frozen_run_resumes_as_uninterrupted(tiny_world, tmp_path, "sampler:2", message, exit_code=1, **{**QUICK, "max_steps": 6})
    deadline, slowest = int(run.found.group(1)), float(run.found.group(2))
    assert abs(deadline - max(60.0, 10 * slowest)) <= 1  # 60 s on a quiet machine: the demo's steps take 0.1 s
    assert re.search(r"\d\d:\d\d:\d\d (sampling|sent|loaded)", run.log)  # the sampler's last events, from its log
    assert deadline <= run.seconds < deadline + 90  # start, two steps, the deadline, then 10 s for the sampler to stop


def test_a_sampler_of_a_tensor_parallel_trainer_holds_whole_models():
    argv = ["config.json", "--tensor_model_parallel_size", "2", "--max_steps", "3", "--tensor_parallel_degree=2"]
    assert whole_model_argv(argv) == ["config.json", "--max_steps", "3", "--tensor_parallel_degree", "1"]
