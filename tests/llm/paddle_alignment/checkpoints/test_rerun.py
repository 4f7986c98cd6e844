"""Rerunning a command into an output_dir that holds checkpoints, as a user restarting a crashed job does:
it resumes, a finished run is left as it is, overwrite_output_dir starts afresh, rotation keeps the
checkpoint just written."""

import contextlib
import hashlib
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from paddlenlp.utils.log import logger

from helpers import REPO_ROOT, SFT_CONFIG, run_grpo, train_reward_model, weights
from llm import run_finetune
from paddle_alignment import split_training
from paddle_alignment.checkpoints.folders import last_complete_checkpoint, resolve_resume_checkpoint, rotate_checkpoints

# Small runs: a checkpoint every step, no evaluation, a learning rate that does not depend on max_steps.
QUICK = {"save_steps": 1, "eval_datasets": "", "lr_scheduler_type": "constant"}


@pytest.fixture
def log_text(caplog):
    """The paddlenlp logger's messages so far (it does not propagate to the root logger caplog watches)."""
    logger.logger.addHandler(caplog.handler)
    yield lambda: caplog.text
    logger.logger.removeHandler(caplog.handler)


def folders(path):
    return sorted(name for name in os.listdir(path) if "checkpoint-" in name)


def snapshot(root):
    """{relative path: (sha256, mtime_ns)} of every file under `root`."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = (hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns)
    return found


def test_rerun_with_more_steps_resumes_from_the_last_checkpoint(tiny_world, tmp_path, log_text):
    run_grpo(tiny_world, tmp_path / "rerun", **QUICK, max_steps=2, save_total_limit=1)
    assert folders(tmp_path / "rerun") == ["checkpoint-2"]

    # The same command with more steps continues from checkpoint-2, and rotation keeps the new checkpoints.
    run_grpo(tiny_world, tmp_path / "rerun", **QUICK, max_steps=4, save_total_limit=1)
    assert f"resumed from {tmp_path / 'rerun' / 'checkpoint-2'} at step 2" in log_text()
    assert folders(tmp_path / "rerun") == ["checkpoint-4"]

    run_grpo(tiny_world, tmp_path / "straight", **QUICK, max_steps=4)
    resumed, straight = weights(tmp_path / "rerun" / "policy"), weights(tmp_path / "straight" / "policy")
    for name in straight:
        np.testing.assert_allclose(resumed[name], straight[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_rerunning_a_finished_run_changes_nothing(tiny_world, tmp_path, log_text):
    finished = {**QUICK, "max_steps": 2, "eval_datasets": tiny_world["eval"], "eval_steps": 0}  # with the final eval
    output_dir = tmp_path / "run"
    run_grpo(tiny_world, output_dir, **finished)
    before = snapshot(output_dir)
    assert "eval_results.json" in before and "policy/model.safetensors" in before

    run_grpo(tiny_world, output_dir, **finished)
    assert "already finished at step 2" in log_text()
    assert snapshot(output_dir) == before

    # A crash between the last checkpoint and the final save: the rerun writes the final policy from the
    # checkpoint and touches nothing else.
    os.rename(output_dir / "policy", tmp_path / "lost_policy")
    run_grpo(tiny_world, output_dir, **finished)
    after = snapshot(output_dir)
    assert after.keys() == before.keys()
    assert {k: v for k, v in after.items() if not k.startswith("policy/")} == {
        k: v for k, v in before.items() if not k.startswith("policy/")
    }
    restored = weights(output_dir / "policy")
    for name, value in weights(tmp_path / "lost_policy").items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_overwrite_output_dir_removes_the_old_checkpoints_and_starts_at_step_zero(tiny_world, tmp_path, log_text):
    run_grpo(tiny_world, tmp_path, **QUICK, max_steps=2, save_total_limit=None)
    os.makedirs(tmp_path / ".tmp-checkpoint-3")  # a save that was interrupted
    assert folders(tmp_path) == [".tmp-checkpoint-3", "checkpoint-1", "checkpoint-2"]

    # An evaluation-only run neither resumes nor removes anything, whatever overwrite_output_dir says.
    run_grpo(tiny_world, tmp_path, do_eval=True, overwrite_output_dir=True)
    assert folders(tmp_path) == [".tmp-checkpoint-3", "checkpoint-1", "checkpoint-2"]
    assert "resumed from" not in log_text()

    run_grpo(tiny_world, tmp_path, **QUICK, max_steps=1, overwrite_output_dir=True)
    assert "removed checkpoint-1, checkpoint-2, .tmp-checkpoint-3" in log_text()
    assert "resumed from" not in log_text()
    assert folders(tmp_path) == ["checkpoint-1"]


# Another run's process: it claims OUTPUT_DIR as run_ppo does, says so, and keeps running.
CLAIMING_RUN = """
import sys, time
from paddle_alignment.checkpoints.folders import claim_output_dir
claim_output_dir(sys.argv[1])
print("claimed", flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def another_run_holding(output_dir):
    """Inside the block another process holds `output_dir` (it fails the test if it cannot); it is killed after."""
    run = subprocess.Popen([sys.executable, "-c", CLAIMING_RUN, str(output_dir)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline().strip() == "claimed"
        yield run
    finally:
        run.kill()
        run.wait()
        run.stdout.close()


def test_a_rerun_while_the_first_run_still_runs_stops_before_touching_its_output_dir(tiny_world, tmp_path):
    run_grpo(tiny_world, tmp_path, **QUICK, max_steps=1)
    # The first run's processes, still running (e.g. after its launcher was killed).
    with another_run_holding(tmp_path) as first:
        before = snapshot(tmp_path)
        # Even a rerun that would start afresh (removing the checkpoints) stops first, naming the other run.
        with pytest.raises(RuntimeError, match=rf"output_dir {tmp_path} is in use by another run \(pid {first.pid} on "):
            run_grpo(tiny_world, tmp_path, **QUICK, max_steps=2, overwrite_output_dir=True)
        assert snapshot(tmp_path) == before
    # Killed, the first run holds nothing: the rerun resumes, and once it has ended another run may start.
    run_grpo(tiny_world, tmp_path, **QUICK, max_steps=2)
    assert folders(tmp_path) == ["checkpoint-1", "checkpoint-2"] and ".run.lock" not in os.listdir(tmp_path)
    with another_run_holding(tmp_path):
        pass


def sft_run(world, output_dir):
    run_finetune.main([
        SFT_CONFIG, "--model_name_or_path", world["random_model"], "--dataset_name_or_path", os.path.dirname(world["sft_train"]),
        "--output_dir", str(output_dir), "--logging_dir", str(output_dir / "vdl"), "--max_steps", "1",
    ])


@pytest.mark.parametrize(
    "run", [
        pytest.param(lambda world, output_dir: train_reward_model(world, str(output_dir), max_steps=1), id="reward-model"),
        pytest.param(sft_run, id="sft"),
    ],
)
def test_reward_model_and_sft_runs_stop_in_an_output_dir_another_run_holds(tiny_world, tmp_path, run):
    with another_run_holding(tmp_path) as first:
        with pytest.raises(RuntimeError, match=rf"output_dir {tmp_path} is in use by another run \(pid {first.pid} on "):
            run(tiny_world, tmp_path)
        assert not any(name.startswith(("checkpoint-", "model_state")) for name in os.listdir(tmp_path))
    run(tiny_world, tmp_path)
    assert ".run.lock" not in os.listdir(tmp_path)


def test_resume_from_checkpoint_true_without_a_checkpoint_names_the_output_dir(tiny_world, tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"output_dir {tmp_path} holds no complete checkpoint")):
        run_grpo(tiny_world, tmp_path, **QUICK, resume_from_checkpoint="true")


@pytest.mark.parametrize("spelling", ["True", "true"])  # a JSON `true` parses to "True", a command-line one stays "true"
def test_resume_from_checkpoint_true_picks_the_last_complete_checkpoint(tmp_path, spelling):
    for name in ["checkpoint-2", "checkpoint-10", "checkpoint-12", ".tmp-checkpoint-20", ".old-checkpoint-30"]:
        os.makedirs(tmp_path / name)
        (tmp_path / name / "trainer_state.json").write_text("{}")
    os.remove(tmp_path / "checkpoint-12" / "trainer_state.json")  # not a checkpoint this toolkit wrote
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")
    args = SimpleNamespace(resume_from_checkpoint=spelling, overwrite_output_dir=False, output_dir=str(tmp_path))
    resolve_resume_checkpoint(args, training=True)
    assert args.resume_from_checkpoint == str(tmp_path / "checkpoint-10")

    args.overwrite_output_dir = True  # starting afresh and resuming contradict each other
    with pytest.raises(ValueError, match="overwrite_output_dir starts afresh"):
        resolve_resume_checkpoint(args, training=True)
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_a_split_model_resumed_with_true_reads_the_last_complete_checkpoint(tmp_path, monkeypatch):
    """SplitModelMixin (tensor-parallel RM/SFT trainers) given resume_from_checkpoint=True from Python reads its
    slices from the last checkpoint holding a trainer state, not from a stray higher folder."""
    for name in ["checkpoint-3", "checkpoint-7"]:
        os.makedirs(tmp_path / name)
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text("{}")
    read = []
    monkeypatch.setattr(split_training, "is_tensor_parallel", lambda model: True)
    monkeypatch.setattr(split_training, "load_into", lambda model, folder: read.append(folder))
    trainer = SimpleNamespace(model=None, args=SimpleNamespace(output_dir=str(tmp_path)))
    split_training.SplitModelMixin._load_from_checkpoint(trainer, True)
    assert read == [str(tmp_path / "checkpoint-3")]
    os.remove(tmp_path / "checkpoint-3" / "trainer_state.json")
    with pytest.raises(FileNotFoundError, match=re.escape(f"output_dir {tmp_path} holds no complete checkpoint")):
        split_training.SplitModelMixin._load_from_checkpoint(trainer, True)


def test_rotation_keeps_the_checkpoint_just_written_beside_a_stale_higher_one(tmp_path):
    for step in [1, 2, 9]:
        os.makedirs(tmp_path / f"checkpoint-{step}")
    rotate_checkpoints(str(tmp_path), limit=1, just_written=2)
    assert folders(tmp_path) == ["checkpoint-2", "checkpoint-9"]
