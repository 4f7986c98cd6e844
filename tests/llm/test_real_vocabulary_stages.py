"""Every stage at a real model's shape, from a Hugging Face-layout folder: Qwen2.5-0.5B's architecture cut
to 2 layers (vocabulary 151,936), written as the hub ships it (conftest's `real_world`)."""

import json
import os
import subprocess

import numpy as np
import paddle
import pytest

from helpers import REAL_RUN, REPO_ROOT, RM_CONFIG, SFT_CONFIG, TINY_CONFIG, logged, running_reward_server, transformers_python
from llm import run_finetune
from llm.alignment.ppo import run_ppo
from llm.alignment.rm import run_reward
from llm.predict import predictor
from llm.tools import convert_gsm8k
from paddle_alignment.models.hf_layout import weight_files
from paddle_alignment.models.loading import load_tokenizer, pretrained_causal_lm

PPO_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "ppo_argument.json")
GSM8K_CONFIG = os.path.join(REPO_ROOT, "config", "qwen", "grpo_gsm8k_argument.json")
GSM8K_SAMPLE = os.path.join(REPO_ROOT, "tests", "data", "gsm8k_sample.jsonl")
TRANSFORMERS_PYTHON = transformers_python()


def argv(**values):
    return [token for key, value in values.items() for token in (f"--{key}", str(value))]


def model_weights(path):
    return {name: value.numpy() for name, value in pretrained_causal_lm(path).state_dict().items()}


def last_logits(path, input_ids):
    model = pretrained_causal_lm(path, dtype="float32")
    model.eval()
    return model(paddle.to_tensor([input_ids]))[0].numpy()[0]


@pytest.fixture(scope="module")
def grpo_run(real_world, tmp_path_factory):
    """The README's GRPO command on the Hugging Face folder (paths changed), scored by the kk reward
    server, 2 steps with a checkpoint after each and the final policy exported in Hugging Face's layout."""
    output_dir = tmp_path_factory.mktemp("real_grpo")
    with running_reward_server("kk") as url:
        run_ppo.main([TINY_CONFIG, *grpo_argv(real_world, output_dir, reward_server=url, save_steps=1, export_hf="true")])
    return output_dir


def grpo_argv(world, output_dir, **changes):
    return argv(**{
        "actor_model_name_or_path": world["model"], "train_datasets": world["train"], "eval_datasets": world["eval"],
        "output_dir": output_dir, "logging_dir": os.path.join(output_dir, "vdl"), "reward_task": "kk",
        "max_steps": 2, "eval_steps": 2, "learning_rate": 1e-4, "kl_loss_coeff": 0.01, **REAL_RUN, **changes,
    })


@pytest.mark.slow
def test_grpo_runs_from_a_hugging_face_folder_and_resumes_exactly(real_world, grpo_run, tmp_path):
    assert weight_files(real_world["model"])  # the actor really is in Hugging Face's layout
    # The kk server scored every sampled response (a random policy's: the format penalty, -3 per kk's rule).
    assert logged(os.path.join(grpo_run, "vdl"), "train/reward_mean") == [-3.0, -3.0]
    resumed = tmp_path / "resumed"
    with running_reward_server("kk") as url:
        run_ppo.main([TINY_CONFIG, *grpo_argv(
            real_world, resumed, reward_server=url, resume_from_checkpoint=grpo_run / "checkpoint-1", save_steps=1
        )])
    expected, got = model_weights(str(grpo_run / "policy")), model_weights(str(resumed / "policy"))
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    # The training moved the policy away from the folder it started from.
    start = model_weights(real_world["model"])
    assert max(np.abs(expected[n] - start[n].astype("float32")).max() for n in expected) > 1e-5


@pytest.mark.slow
def test_the_run_exports_its_policy_in_hugging_face_layout(real_world, grpo_run):
    exported = grpo_run / "policy_hf"
    assert weight_files(str(exported)) == [str(exported / "model.safetensors")]
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (exported / name).is_file(), name
    assert json.loads((exported / "generation_config.json").read_text())["eos_token_id"] == [151645, 151643]
    tokenizer = load_tokenizer(str(exported))
    prompt = json.loads(open(real_world["eval"]).readline())["src"]
    input_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert input_ids == load_tokenizer(real_world["model"])(prompt, add_special_tokens=False)["input_ids"]
    np.testing.assert_allclose(last_logits(str(exported), input_ids), last_logits(str(grpo_run / "policy"), input_ids), atol=1e-5)
    if TRANSFORMERS_PYTHON:
        script = (
            "import sys, json, numpy, torch, transformers\n"
            "tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])\n"
            "ids = tok(json.loads(open(sys.argv[2]).readline())['src'])['input_ids']\n"
            "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()\n"
            "with torch.no_grad(): numpy.save(sys.argv[3], m(torch.tensor([ids])).logits[0].numpy())\n"
        )
        out = exported.parent / "transformers_logits.npy"
        subprocess.run([TRANSFORMERS_PYTHON, "-c", script, str(exported), real_world["eval"], str(out)], check=True)
        np.testing.assert_allclose(np.load(out), last_logits(str(exported), input_ids), atol=1e-5)


def test_the_export_command_writes_any_saved_policy(real_world, tmp_path):
    from llm.tools.export_hf import export_hf

    export_hf(real_world["model"], str(tmp_path / "export"), dtype="bfloat16")
    with pytest.raises(FileExistsError, match="is not empty"):
        export_hf(real_world["model"], str(tmp_path / "export"))
    exported, original = model_weights(str(tmp_path / "export")), model_weights(real_world["model"])
    for name in original:
        np.testing.assert_array_equal(exported[name], original[name], err_msg=name)


@pytest.mark.slow
def test_ppo_takes_its_actor_reference_reward_model_and_critic_from_a_hugging_face_folder(real_world, tmp_path):
    folder = real_world["model"]
    run_ppo.main([PPO_CONFIG, *argv(
        actor_model_name_or_path=folder, reference_model_name_or_path=folder, reward_model_name_or_path=folder,
        reward_critic_model_name_or_path=folder, train_datasets=real_world["train"], eval_datasets="",
        output_dir=tmp_path, logging_dir=tmp_path / "vdl", max_steps=1, save_steps=10,
        **{**REAL_RUN, "rollout_n": 1, "per_device_train_batch_size": 2},
    )])
    assert len(logged(tmp_path / "vdl", "train/val/value_mean")) == 1
    assert (tmp_path / "value" / "config.json").is_file() and (tmp_path / "policy" / "config.json").is_file()


@pytest.mark.slow
def test_sft_and_reward_model_training_start_from_a_hugging_face_folder(real_world, tmp_path):
    sft_data = tmp_path / "sft"
    sft_data.mkdir()
    os.symlink(real_world["sft_train"], sft_data / "train.json")
    run_finetune.main([SFT_CONFIG, *argv(
        model_name_or_path=real_world["model"], dataset_name_or_path=sft_data, output_dir=tmp_path / "sft_out",
        logging_dir=tmp_path / "sft_vdl", max_steps=2, per_device_train_batch_size=4, logging_steps=1, warmup_steps=0,
    )])
    assert len(logged(tmp_path / "sft_vdl", "train/loss")) == 2
    run_reward.main([RM_CONFIG, *argv(
        model_name_or_path=real_world["model"], train_datasets=real_world["pref_train"], eval_datasets=real_world["pref_eval"],
        output_dir=tmp_path / "rm_out", logging_dir=tmp_path / "rm_vdl", max_steps=2, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, logging_steps=1, eval_steps=2,
    )])
    assert json.loads((tmp_path / "rm_out" / "eval_results.json").read_text())["eval_accuracy"] >= 0


def greedy_continuation(path, input_ids, steps):
    """Greedy decoding by full forwards of the plain model: the reference for the fast decode loop."""
    model = pretrained_causal_lm(path, dtype="float32")
    model.eval()
    ids = list(input_ids)
    for _ in range(steps):
        ids.append(int(model(paddle.to_tensor([ids]))[0][0, -1].argmax()))
    return ids[len(input_ids):]


def test_the_predictor_decodes_a_hugging_face_folder_greedily(real_world, tmp_path):
    output = tmp_path / "out.jsonl"
    predictor.main(argv(model_name_or_path=real_world["model"], data_file=real_world["eval"], output_file=output,
                        max_length=6, batch_size=2, dtype="float32"))
    rows = [json.loads(line) for line in open(output, encoding="utf-8")]
    tokenizer = load_tokenizer(real_world["model"])
    for row in rows[:2]:
        input_ids = tokenizer(row["src"], add_special_tokens=False)["input_ids"]
        assert row["output"] == tokenizer.decode(greedy_continuation(real_world["model"], input_ids, 6))
    if TRANSFORMERS_PYTHON:
        # transformers' greedy search on the same folder (without the repetition penalty its
        # generation_config.json sets, which PaddleNLP's predictor flags leave at 1.0).
        script = (
            "import sys, json, torch, transformers\n"
            "tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])\n"
            "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()\n"
            "for line in open(sys.argv[2]):\n"
            "    ids = torch.tensor([tok(json.loads(line)['src'])['input_ids']])\n"
            "    out = m.generate(ids, max_new_tokens=6, do_sample=False, repetition_penalty=1.0)\n"
            "    print(json.dumps(tok.decode(out[0, ids.shape[1]:])))\n"
        )
        result = subprocess.run([TRANSFORMERS_PYTHON, "-c", script, real_world["model"], real_world["eval"]], check=True, capture_output=True, text=True)
        assert [json.loads(line) for line in result.stdout.splitlines()] == [row["output"] for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize("tools", ["", "tool_samples:add"])
def test_gsm8k_recipe_config_runs_a_step_and_logs_the_answer_and_format_rewards(real_world, tmp_path, tools, monkeypatch):
    """config/qwen/grpo_gsm8k_argument.json on one CPU process (its GPU layout and sizes changed), on GSM8K
    rows converted with the recipe's prompt; and the same with a tool (multi-turn rollouts through Qwen2.5's
    vocabulary and chat template)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(REPO_ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    data = tmp_path / "gsm8k.jsonl"
    convert_gsm8k.convert_file(GSM8K_SAMPLE, data, prompt_style="think_answer")
    single_cpu = {
        "device": "cpu", "bf16": "false", "sharding": "", "sharding_parallel_degree": -1, "recompute": "false",
        "offload_level": "", "gradient_accumulation_steps": 1, "max_steps": 1, "max_eval_samples": 2,
    }
    run_ppo.main([GSM8K_CONFIG, *argv(**{
        "actor_model_name_or_path": real_world["model"], "train_datasets": data, "eval_datasets": data,
        "output_dir": tmp_path / "run", "logging_dir": tmp_path / "vdl", **single_cpu, **REAL_RUN, "max_prompt_len": 256,
        "tools": tools, "max_turns": 2,
    })])
    if tools:  # a random policy calls no tool: one turn each, counted
        assert logged(tmp_path / "vdl", "train/multi_turn/turns") == [1.0]
        assert len(logged(tmp_path / "vdl", "train/multi_turn/rerender_differs")) == 1
    # A random policy writes neither the form nor the answer: each part at its minimum, both logged.
    assert logged(tmp_path / "vdl", "train/answer_reward_mean") == [-1.0]
    assert logged(tmp_path / "vdl", "train/format_reward_mean") == [-1.0]
    assert logged(tmp_path / "vdl", "train/answer_accuracy") == [0.0] == logged(tmp_path / "vdl", "train/format_accuracy")
    assert logged(tmp_path / "vdl", "train/reward_error_rows") == [0.0]
