"""GRPO end to end on the tiny config: in one process, resumed from a checkpoint, and under
`paddle.distributed.launch` with two gloo data-parallel processes."""

import io
import itertools
import json
import os
import re
import threading

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import (
    REPO_ROOT, TINY_CONFIG, assert_frozen_run_resumes_as_uninterrupted, built_paddlenlp_ops, launch_two_processes, logged, overrides,
    protocol_only_app, run_grpo, running_reward_server, serving, weights,
)
from llm.alignment.ppo import run_ppo
from llm.alignment.ppo.reward_server import create_app
from paddle_alignment.data import PromptOnlyDataset
from paddle_alignment.rewards import REWARD_TASKS, RewardTask, get_reward_task
from paddle_alignment.rewards.arith import arith_reward
from paddle_alignment.rewards.client import RewardServerError
from paddle_alignment.rollout.decode import ROLLOUT_OPS, SamplingConfig, generate_rollouts

def test_three_grpo_steps_through_the_reward_server(tiny_world, tmp_path):
    with running_reward_server("arith") as url:
        run_grpo(tiny_world, tmp_path, use_rm_server=True, use_rule_reward=False, reward_server=url)

    # The policy is a complete checkpoint that from_pretrained loads, and it moved away from the start.
    trained, initial = weights(tmp_path / "policy"), weights(tiny_world["model"])
    assert trained.keys() == initial.keys()
    assert any(not np.array_equal(trained[k], initial[k]) for k in trained)
    assert not any(name.startswith(".tmp-") for name in os.listdir(tmp_path))
    assert sorted(os.listdir(tmp_path / "checkpoint-3")) == [
        "data_state.json", "optimizer.pdopt", "policy", "rng_state.pth", "scheduler.pdparams", "trainer_state.json"
    ]
    for split in ["initial_eval", "eval"]:
        metrics = json.loads((tmp_path / f"{split}_results.json").read_text())
        assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    vdl_files = os.listdir(tmp_path / "vdl")
    assert any(name.startswith("vdlrecords") for name in vdl_files)


def test_rows_the_reward_cannot_score_are_counted_and_the_run_goes_on(tiny_world, tmp_path, monkeypatch):
    arith = get_reward_task("arith")

    def fails_on_prompts_starting_with_1(src, tgt, response):
        if src.startswith("1"):
            raise RuntimeError("lookup table missing")
        return arith.score(src, tgt, response)

    flaky = RewardTask("flaky_arith", fails_on_prompts_starting_with_1, 1.0, 0.0, arith.read_target, {})
    monkeypatch.setitem(REWARD_TASKS, "flaky_arith", flaky)
    prompts = [json.loads(line)["src"] for line in open(tiny_world["train"])]
    assert any(p.startswith("1") for p in prompts) and not all(p.startswith("1") for p in prompts)
    run_grpo(tiny_world, tmp_path, use_rule_reward=True, reward_task="flaky_arith", max_steps=2)
    assert json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    error_rows = logged(tmp_path / "vdl", "train/reward_error_rows")
    assert len(error_rows) == 2 and sum(error_rows) > 0


def test_what_an_unscored_row_is_given_changes_no_weight(tiny_world, tmp_path, monkeypatch):
    """Rows the rule cannot score leave the advantages, their groups' statistics and the loss: whether they carry
    the rule's min score 0 or -5, the first step ends on the same weights (it would not if they were trained on)."""

    def by_length_failing_on_some(src, tgt, response):
        """Scores that differ within groups, so the step moves the weights; some rows of a group unscored."""
        if len(response) == 1:
            raise RuntimeError("lookup table missing")
        return float(len(response) % 3)

    for min_score in (0.0, -5.0):
        task = RewardTask(f"flaky_{min_score}", by_length_failing_on_some, 2.0, min_score, str, {})
        monkeypatch.setitem(REWARD_TASKS, task.name, task)
        run_grpo(tiny_world, tmp_path / task.name, reward_task=task.name, max_steps=1, save_steps=1, eval_steps=0,
                 kl_loss_coeff=0.0, temperature=1.5)
    unscored = logged(tmp_path / "flaky_0.0" / "vdl", "train/reward_error_rows")
    assert unscored[0] > 0 and logged(tmp_path / "flaky_-5.0" / "vdl", "train/reward_error_rows") == unscored
    first, second = (weights(tmp_path / name / "checkpoint-1" / "policy") for name in ("flaky_0.0", "flaky_-5.0"))
    assert all(np.array_equal(first[name], second[name]) for name in first)
    assert any(not np.array_equal(first[name], value) for name, value in weights(tiny_world["model"]).items())


POWER_TOWER = "\\boxed{9^{9^{9^{9}}}}"


def writing_power_towers(app):
    """The reward server `app`, as if the policy answered every other row with a power tower, whose reference is
    a root (so each comparison runs to the symbolic deadline: against a number a tower is graded at once)."""

    def towers(environ, start_response):
        if environ["REQUEST_METHOD"] != "POST":
            return app(environ, start_response)
        body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        body["response"] = [POWER_TOWER if row % 2 else response for row, response in enumerate(body["response"])]
        body["tgt"] = ["\\sqrt{2}" if row % 2 else tgt for row, tgt in enumerate(body["tgt"])]
        data = json.dumps(body).encode()
        environ = {**environ, "wsgi.input": io.BytesIO(data), "CONTENT_LENGTH": str(len(data))}
        return app(environ, start_response)

    return towers


def test_a_policy_writing_power_towers_keeps_training_through_the_reward_server(tiny_world, tmp_path):
    """Eight towers a request at 2 s each would take 16 s, past the client's 13 s timeout (then retries, then the
    run stops); the server's 3 s budget answers in time, the towers it did not reach as row errors."""
    from paddle_alignment.rewards import symbolic

    symbolic.configure(workers=1, deadline=2.0)
    try:
        with serving(writing_power_towers(create_app("math", grading_budget=3.0))) as url:
            run_grpo(tiny_world, tmp_path, use_rm_server=True, use_rule_reward=False, reward_server=url, reward_task="math",
                     reward_server_timeout=13, reward_server_max_retries=0, max_steps=2, eval_steps=0)
    finally:
        symbolic.configure()
    assert json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    unscored = logged(tmp_path / "vdl", "train/reward_error_rows")
    assert len(unscored) == 2 and all(0 < rows <= 8 for rows in unscored)  # towers only: the other 8 rows are scored


def test_a_reference_the_reward_cannot_read_stops_the_run_at_start_naming_its_line(tiny_world, tmp_path):
    rows = open(tiny_world["train"]).read().splitlines()[:6]
    rows[4] = json.dumps({**json.loads(rows[4]), "tgt": "seventeen"})
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=rf"{train}:5: the reward cannot read the reference answer \('tgt'\): arith tgt 'seventeen'"):
        run_grpo(tiny_world, tmp_path / "run", use_rule_reward=True, reward_task="arith", train_datasets=train)
    assert not (tmp_path / "run" / "checkpoint-1").exists()


def test_rloo_with_gspo_loss_and_entropy_bonus_trains(tiny_world, tmp_path):
    run_grpo(
        tiny_world, tmp_path, rl_algorithm="rloo", policy_loss="gspo", enable_overlong_reward_buffer=True, overlong_reward_buffer=2, clip_range_ratio_low=0.0003,
        clip_range_ratio_high=0.0004, loss_agg_mode="seq-mean-token-mean", entropy_coeff=0.01, update_iters=2,
        eval_steps=0,
    )
    trained, initial = weights(tmp_path / "policy"), weights(tiny_world["model"])
    assert any(not np.array_equal(trained[k], initial[k]) for k in trained)
    assert all(np.isfinite(v).all() for v in trained.values())


@pytest.mark.parametrize("settings", [
    dict(rl_algorithm="reinforce_plus_plus_baseline", policy_loss="cispo", clip_range_ratio_low=1.0,
         loss_agg_mode="seq-mean-token-sum-norm"),
    dict(policy_loss="sapo", sapo_tau_neg=2.0, update_iters=2),
    dict(policy_loss="gmpo", clip_range_ratio=0.4, update_iters=2),
], ids=["rf++baseline-cispo-drgrpo", "sapo", "gmpo"])
def test_the_audits_losses_and_estimator_train(tiny_world, tmp_path, settings):
    run_grpo(tiny_world, tmp_path, eval_steps=0, **settings)
    trained, initial = weights(tmp_path / "policy"), weights(tiny_world["model"])
    assert any(not np.array_equal(trained[k], initial[k]) for k in trained)
    assert all(np.isfinite(v).all() for v in trained.values())


@pytest.mark.parametrize("correction", ["token_tis", "geometric_mask"])
def test_the_rollout_gap_is_logged_every_step_and_a_correction_trains(tiny_world, tmp_path, correction):
    """The fast decode loop's log-probs against the trainer's, every step: float32 on one CPU gives the same
    numbers up to rounding, so the gap reads ~0, and a correction leaves every token its full weight."""
    built_paddlenlp_ops(ROLLOUT_OPS)
    run_grpo(tiny_world, tmp_path, eval_steps=0, rollout_correction=correction, rollout_is_threshold=1.001)
    gaps, weights_kept = logged(tmp_path / "vdl", "train/rollout_corr/logprob_diff_max"), logged(tmp_path / "vdl", "train/rollout_corr/weight_mean")
    assert len(gaps) == 3 and max(gaps) < 1e-4
    assert weights_kept == pytest.approx([1.0] * 3, abs=1e-3)
    trained, initial = weights(tmp_path / "policy"), weights(tiny_world["model"])
    assert any(not np.array_equal(trained[k], initial[k]) for k in trained)


def test_a_correction_without_the_samplers_log_probs_stops_the_run(tiny_world, tmp_path):
    with pytest.raises(ValueError, match="rollout_correction=icepop weights the loss by the sampler's log-probs"):
        run_grpo(tiny_world, tmp_path, eval_steps=0, rollout_correction="icepop", use_fusemt=False)
    assert not (tmp_path / "policy").exists()


def test_a_run_with_tools_samples_trajectories_and_logs_their_counters(tiny_world, tmp_path, monkeypatch):
    """The tools path end to end (rollouts through agents/trajectories.py, evaluation included): the demo's policy
    never calls the tool, so every trajectory is one turn, as counted."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(REPO_ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    run_grpo(tiny_world, tmp_path, tools="tool_samples:add", max_steps=2, eval_steps=0, save_steps=0)
    assert logged(tmp_path / "vdl", "train/multi_turn/turns") == [1.0, 1.0]
    assert logged(tmp_path / "vdl", "train/multi_turn/tool_calls") == [0.0, 0.0]
    assert (tmp_path / "policy").is_dir()


def test_a_run_with_an_environment_and_no_reward_source_is_scored_by_its_returns(tiny_world, tmp_path, monkeypatch):
    """GuessTheNumber answers each wrong sum higher or lower and pays 1 for the right one: the tiny policy's
    trajectories take several turns, their returns are the scores, and the sampler's log-probs of every turn
    are the trainer's."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(REPO_ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    run_grpo(tiny_world, tmp_path, use_rule_reward=False, environment="tool_samples:GuessTheNumber", max_turns=3,
             max_dec_len=90, max_length=106, max_steps=2, eval_steps=0, save_steps=0)
    turns, rewards = logged(tmp_path / "vdl", "train/multi_turn/turns"), logged(tmp_path / "vdl", "train/reward_mean")
    assert len(turns) == 2 and min(turns) > 2 and all(0 <= r <= 1 for r in rewards)
    assert max(logged(tmp_path / "vdl", "train/multi_turn/env_errors")) == 0
    assert max(logged(tmp_path / "vdl", "train/multi_turn/truncated")) == 0
    # A trajectory ends before max_turns only on the right guess, which pays 1.
    assert [t < 3 for t in turns] == [r > 0 for r in rewards] and rewards[1] > 0
    for turn in (1, 2):
        assert max(logged(tmp_path / "vdl", f"train/rollout_corr/logprob_diff_mean/turn_{turn}")) < 1e-4
    assert (tmp_path / "policy").is_dir()


def test_reinforce_plus_plus_with_kl_in_the_reward_trains(tiny_world, tmp_path):
    # A reference other than the actor: the KL penalty differs between samples from the first step, so the
    # policy moves even when every sampled answer earns the same score.
    run_grpo(
        tiny_world, tmp_path, rl_algorithm="reinforce_plus_plus", kl_coeff=0.05, kl_loss_coeff=0.0, gamma=0.99,
        eval_steps=0, reference_model_name_or_path=tiny_world["random_model"], reward_kl_estimator="k3",
    )
    trained, initial = weights(tmp_path / "policy"), weights(tiny_world["model"])
    assert any(not np.array_equal(trained[k], initial[k]) for k in trained)
    assert all(np.isfinite(v).all() for v in trained.values())


def test_evaluation_only_run_writes_eval_results_and_trains_nothing(tiny_world, tmp_path):
    run_grpo(tiny_world, tmp_path, do_eval=True)
    metrics = json.loads((tmp_path / "eval_results.json").read_text())
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert not (tmp_path / "policy").exists() and not any(n.startswith("checkpoint-") for n in os.listdir(tmp_path))
    with pytest.raises(ValueError, match="set eval_datasets"):
        run_ppo.main([TINY_CONFIG, *overrides(tiny_world, str(tmp_path), do_eval=True, eval_datasets="")])


def test_run_stops_when_the_reward_server_is_down(tiny_world, tmp_path):
    dead_url = "http://127.0.0.1:9"  # the discard port: nothing listens on it here
    with pytest.raises(RewardServerError, match="unreachable"):
        run_grpo(
            tiny_world, tmp_path, use_rm_server=True, use_rule_reward=False, reward_server=dead_url,
            reward_server_timeout=0.5, reward_server_max_retries=1,
        )
    assert not (tmp_path / "policy").exists()


def judging_app(asked, readable=lambda response: response.strip().isdigit()):
    """A judge server of the reward-server protocol: score 1 when the response is the reference, 0 when it is
    another number, and no verdict (a row error) for anything else or anything not `readable`; records the `src`
    it was asked."""

    def app(environ, start_response):
        body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        asked.extend(body["src"])
        scores, errors = [], []
        for index, (reference, response) in enumerate(zip(body["tgt"], body["response"])):
            number = readable(response)
            scores.append(float(number and response.strip() == reference))
            if not number:
                errors.append({"index": index, "error_msg": "no verdict"})
        answer = json.dumps({"error_code": 0, "error_msg": "", "score": scores, "row_errors": errors}).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))])
        return [answer]

    return app


def test_a_judge_server_scores_and_the_rows_it_gives_no_verdict_leave_the_batch(tiny_world, tmp_path):
    asked = []
    template = "Grade: {prompt}{response} (reference {reference})"
    with serving(judging_app(asked)) as url:
        run_grpo(tiny_world, tmp_path, use_rule_reward=False, judge_server=url, judge_prompt_template=template,
                 judge_max_score=1, max_steps=2, eval_steps=2, temperature=1.5)
        assert re.fullmatch(r"Grade: \d\+\d\+\d=.* \(reference \d+\)", asked[0], re.DOTALL)
        excluded = logged(tmp_path / "vdl", "train/judge/excluded_frac")
        assert len(excluded) == 2 and 0 < max(excluded) < 1  # a hot sampler writes some non-numbers
        assert 0 <= logged(tmp_path / "vdl", "train/accuracy")[0] <= 1 and logged(tmp_path / "vdl", "train/reward_error_rows") == [0.0, 0.0]
        evaluation = json.loads((tmp_path / "eval_results.json").read_text())
        assert 0 <= evaluation["eval_judge_excluded_frac"] < 1 and 0 <= evaluation["eval_accuracy"] <= 1
        record = json.loads((tmp_path / "checkpoint-2" / "judge.json").read_text())
        assert record["judge"] == f"server:{url}" and record == json.loads((tmp_path / "judge.json").read_text())
        with pytest.raises(ValueError, match="another judge or prompt \\(prompt_sha256 differ"):
            run_grpo(tiny_world, tmp_path / "again", use_rule_reward=False, judge_server=url,
                     judge_prompt_template=template + " Be strict.", max_steps=3, resume_from_checkpoint=tmp_path / "checkpoint-2")


def test_an_evaluation_the_judge_read_nothing_of_reports_no_reward_or_accuracy(tiny_world, tmp_path):
    with serving(judging_app([], readable=lambda response: False)) as url:
        run_grpo(tiny_world, tmp_path, do_eval=True, use_rule_reward=False, judge_server=url,
                 judge_prompt_template="{prompt}{response}", judge_max_score=1)
    evaluation = json.loads((tmp_path / "eval_results.json").read_text())
    assert evaluation["eval_judge_excluded_frac"] == 1.0
    assert not {"eval_reward_mean", "eval_accuracy"} & set(evaluation)


def test_a_local_model_judges_with_the_template_and_its_replies_without_a_verdict_leave_the_batch(tiny_world, tmp_path):
    """The tiny policy itself as the judge: asked "<response>+<prompt>" it writes a number, read by the pattern."""
    run_grpo(tiny_world, tmp_path, use_rule_reward=False, judge_model_name_or_path=tiny_world["model"],
             judge_prompt_template="{response}+{prompt}", judge_verdict_pattern=r"^(\d+)$", judge_max_new_tokens=4,
             max_steps=2, eval_steps=0, temperature=1.5)
    assert len(logged(tmp_path / "vdl", "train/judge/excluded_frac")) == 2
    assert json.loads((tmp_path / "judge.json").read_text())["judge"] == f"model:{tiny_world['model']}"


def test_a_judge_that_is_down_stops_the_run_naming_it_after_its_retries(tiny_world, tmp_path):
    with pytest.raises(RewardServerError, match="judge server at http://127.0.0.1:9 stayed unreachable after 2 attempts"):
        run_grpo(tiny_world, tmp_path, use_rule_reward=False, judge_server="http://127.0.0.1:9", reward_server_timeout=0.5,
                 reward_server_max_retries=1)
    assert not (tmp_path / "policy").exists()


def stalling_after(answers):
    """The arith reward app (protocol only), answering `answers` scoring requests and holding every later one
    open without an answer until the returned event is set (a reward server that hangs)."""
    count, release = itertools.count(), threading.Event()

    def app(environ, start_response):
        if environ["REQUEST_METHOD"] == "POST" and next(count) >= answers:
            release.wait()
        return protocol_only_app(environ, start_response)

    return app, release


def test_a_hung_reward_server_ends_the_run_within_its_deadline_and_the_rerun_ends_as_an_uninterrupted_run(tiny_world, tmp_path):
    """At the default settings: 10 x the slowest step and at least 60 s after the server stops answering (from
    step 5's request on), the run stops naming the server and the steps done; the same command, with the
    server answering again, resumes from checkpoint-4 and ends on the weights of a run that never waited."""
    argv = dict(use_rm_server=True, use_rule_reward=False, max_steps=6, eval_datasets="", save_steps=2)
    app, release = stalling_after(answers=4)  # one scoring request a step: steps 1 to 4 are scored
    try:
        with serving(protocol_only_app) as url, serving(app) as hung_url:
            message = (rf"reward server at {hung_url} \(POST /\) answered nothing within (\d+) s \(10 x the slowest RL "
                       r"step so far, [0-9.]+ s, and at least 60 s\), after 4 RL steps; last error: ReadTimeout")
            run = assert_frozen_run_resumes_as_uninterrupted(
                tiny_world, tmp_path, None, message, exit_code=1, frozen_changes={"reward_server": hung_url},
                reward_server=url, **argv,
            )
    finally:
        release.set()
    deadline = int(run.found.group(1))
    assert deadline <= run.seconds < deadline + 45  # the run's start and its first steps, then the deadline
    assert f"resumed from {tmp_path / 'out' / 'checkpoint-4'} at step 4" in run.resumed_log


def test_a_stalled_checkpoint_write_ends_the_run_naming_it_and_the_rerun_ends_as_an_uninterrupted_run(tiny_world, tmp_path):
    """Writing checkpoint-4 blocks forever (tests/probes/frozen_run.py): the watchdog ends the process within
    watchdog_timeout, naming the write, the step and the last event; checkpoint-4 is not taken for complete,
    and the same command resumes from checkpoint-2 and ends on the uninterrupted run's weights."""
    out = tmp_path / "out"
    message = (rf"watchdog: checkpoint write did not finish within watchdog_timeout=3 s: {out / 'checkpoint-4'}; after RL "
               r"step 4; the last event before it: RL step 4 done, 0\.\d+ s before it began\.")
    run = assert_frozen_run_resumes_as_uninterrupted(
        tiny_world, tmp_path, "checkpoint-write:4", message, max_steps=6, eval_steps=0, save_steps=2, watchdog_timeout=3,
    )
    assert f"resumed from {out / 'checkpoint-2'} at step 2" in run.resumed_log


def test_fixed_seed_runs_are_identical_and_resume_continues_exactly(tiny_world, tmp_path):
    # Two optimizer steps per RL step (update_iters=2), so old log-probs come from a separate forward;
    # dynamic sampling draws a varying number of prompt batches per step, which resume must replay.
    common = {"max_steps": 4, "update_iters": 2, "eval_steps": 0, "dynamic_sampling": True, "max_gen_batches": 3}
    run_grpo(tiny_world, tmp_path / "straight", **common)
    run_grpo(tiny_world, tmp_path / "again", **common)
    straight = weights(tmp_path / "straight" / "policy")
    again = weights(tmp_path / "again" / "policy")
    for name in straight:
        np.testing.assert_array_equal(straight[name], again[name], err_msg=name)

    # A run that died after checkpoint-2 and is resumed from it ends where the uninterrupted run ends.
    run_grpo(tiny_world, tmp_path / "resumed", **common, resume_from_checkpoint=tmp_path / "straight" / "checkpoint-2")
    resumed = weights(tmp_path / "resumed" / "policy")
    for name in straight:
        np.testing.assert_allclose(resumed[name], straight[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_multi_turn_run_resumed_mid_run_ends_as_the_uninterrupted_run(tiny_world, tmp_path, monkeypatch):
    """Trajectories of several turns (GuessTheNumber answers every wrong sum; the KV cache carried between turns):
    a run resumed from checkpoint-2 ends on the weights of the run that went straight to step 4."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(REPO_ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    common = {"use_rule_reward": False, "environment": "tool_samples:GuessTheNumber", "max_turns": 3, "max_dec_len": 60,
              "max_length": 76, "max_steps": 4, "eval_steps": 0}
    run_grpo(tiny_world, tmp_path / "straight", **common)
    assert min(logged(tmp_path / "straight" / "vdl", "train/multi_turn/turns")) > 2
    run_grpo(tiny_world, tmp_path / "resumed", **common, resume_from_checkpoint=tmp_path / "straight" / "checkpoint-2")
    straight, resumed = weights(tmp_path / "straight" / "policy"), weights(tmp_path / "resumed" / "policy")
    for name in straight:
        np.testing.assert_allclose(resumed[name], straight[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_resume_from_an_incomplete_checkpoint_names_the_missing_file(tiny_world, tmp_path):
    run_grpo(tiny_world, tmp_path, max_steps=2, eval_steps=0)
    os.remove(tmp_path / "checkpoint-2" / "optimizer.pdopt")
    with pytest.raises(FileNotFoundError, match="optimizer.pdopt is missing"):
        run_grpo(tiny_world, tmp_path, max_steps=3, eval_steps=0, resume_from_checkpoint=tmp_path / "checkpoint-2")


@pytest.mark.slow
def test_two_process_data_parallel_run_under_launch(tiny_world, tmp_path):
    argv = overrides(tiny_world, str(tmp_path / "out"), per_device_prompt_batch_size=2, max_steps=2, max_eval_samples=15)
    logs = launch_two_processes(TINY_CONFIG, argv, tmp_path / "launch_log")
    out = tmp_path / "out"
    assert (out / "policy" / "model.safetensors").is_file()
    # Rank 0 writes; every rank's RNG state is kept for an exact resume.
    assert (out / "checkpoint-2" / "rng_state_2.pth").is_file()
    assert len(paddle.load(str(out / "checkpoint-2" / "rng_state_2.pth"), return_numpy=True)) == 2
    # The two ranks' greedy evaluation covers each of the 15 prompts once: it equals a single-process one.
    tokenizer = AutoTokenizer.from_pretrained(tiny_world["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    prompts = PromptOnlyDataset(tiny_world["eval"], tokenizer, max_prompt_len=16, max_samples=15)
    exp = generate_rollouts(model, tokenizer, list(prompts), 1, SamplingConfig(max_dec_len=4, min_dec_len=1, greedy=True))
    expected = np.mean([arith_reward(p, l, r) for p, l, r in zip(exp.prompts, exp.labels, exp.responses)])
    initial = json.loads((out / "initial_eval_results.json").read_text())
    assert initial["eval_accuracy"] == pytest.approx(expected)
    # Rank 0 alone logs metrics, sample tables and VisualDL records.
    assert "reward_mean" in logs[0] and "samples at step" in logs[0]
    assert "samples at step" not in logs[1]
    assert len([n for n in os.listdir(out / "vdl") if n.startswith("vdlrecords")]) == 1
