"""Each model family (Qwen2, Llama, Qwen2-MoE, and Qwen3, Qwen3-MoE and ERNIE 4.5, which the project adds to
paddlenlp's) through every stage, from a folder transformers 5 saved (tests/data/transformers5/pipeline/: a random
model of the family at the tiny world's vocabulary, in bfloat16) with the tiny world's tokenizer and data: SFT,
reward-model training, a PPO step with actor, reference, critic and reward model all of the family, a GRPO step
with its export, tensor parallel, LoRA, and the predictor. (Logits against transformers' own: models/test_rope.py.)"""

import json
import os
import pathlib
import shutil

import numpy as np
import paddle
import pytest

from helpers import REPO_ROOT, RM_CONFIG, SFT_CONFIG, TINY_CONFIG, first_step, logged, small_run_argv
from llm import run_finetune
from llm.alignment.ppo import run_ppo
from llm.alignment.rm import run_reward
from llm.predict import predictor
from paddle_alignment.models.hf_layout import weight_files
from paddle_alignment.models.loading import load_tokenizer, pretrained_causal_lm

PPO_CONFIG = os.path.join(os.path.dirname(TINY_CONFIG), "ppo_argument.json")
FAMILIES = ["qwen2", "llama", "qwen3", "qwen3_moe", "ernie4_5", "qwen2_moe"]
PIPELINE_FOLDERS = os.path.join(REPO_ROOT, "tests", "data", "transformers5", "pipeline")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")


def argv(**values):
    return [token for key, value in values.items() for token in (f"--{key}", str(value))]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tiny_world, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "model"
    shutil.copytree(os.path.join(PIPELINE_FOLDERS, request.param), folder)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(tiny_world["random_model"], name), folder)
    assert weight_files(str(folder))
    return str(folder)


def test_sft_and_reward_model_training_start_from_the_family(family_model, tiny_world, tmp_path):
    run_finetune.main([SFT_CONFIG, *argv(
        model_name_or_path=family_model, dataset_name_or_path=os.path.dirname(tiny_world["sft_train"]),
        output_dir=tmp_path / "sft", logging_dir=tmp_path / "sft_vdl", max_steps=3, per_device_train_batch_size=8,
        logging_steps=1, warmup_steps=0,
    )])
    losses = logged(tmp_path / "sft_vdl", "train/loss")
    assert len(losses) == 3 and losses[-1] < losses[0]
    run_reward.main([RM_CONFIG, *argv(
        model_name_or_path=family_model, train_datasets=tiny_world["pref_train"], eval_datasets=tiny_world["pref_eval"],
        output_dir=tmp_path / "rm", logging_dir=tmp_path / "rm_vdl", max_steps=2, per_device_train_batch_size=8,
        per_device_eval_batch_size=16, logging_steps=1, eval_steps=2,
    )])
    assert 0 <= json.loads((tmp_path / "rm" / "eval_results.json").read_text())["eval_accuracy"] <= 1
    model_type = json.loads(pathlib.Path(family_model, "config.json").read_text())["model_type"]
    assert json.loads((tmp_path / "rm" / "config.json").read_text())["model_type"] == model_type


def test_ppo_takes_actor_reference_critic_and_reward_model_of_the_family(family_model, tiny_world, tmp_path):
    run_ppo.main([PPO_CONFIG, *small_run_argv(
        tiny_world, str(tmp_path), actor_model_name_or_path=family_model, reference_model_name_or_path=family_model,
        reward_model_name_or_path=family_model, reward_critic_model_name_or_path=family_model, eval_datasets="",
        max_steps=1, save_steps=10, rollout_n=1, per_device_train_batch_size=4,
    )])
    assert len(logged(tmp_path / "vdl", "train/val/value_mean")) == 1
    assert (tmp_path / "policy" / "config.json").is_file() and (tmp_path / "value" / "config.json").is_file()


def test_a_grpo_step_trains_the_family_and_exports_it_for_transformers(family_model, tiny_world, tmp_path):
    # Scored by a reward model of the family (a random one: rewards that differ within each group, which a rule
    # would not give a random policy's answers).
    run_ppo.main([TINY_CONFIG, *small_run_argv(
        tiny_world, str(tmp_path), actor_model_name_or_path=family_model, reward_model_name_or_path=family_model,
        use_rm_server="false", max_steps=1, learning_rate=1e-3, export_hf="true",
    )])
    assert len(logged(tmp_path / "vdl", "train/reward_mean")) == 1
    exported = tmp_path / "policy_hf"
    assert weight_files(str(exported))
    ids = paddle.to_tensor([[3, 17, 5, 28, 9]])
    start, trained, saved = (pretrained_causal_lm(path, dtype="float32") for path in (family_model, str(tmp_path / "policy"), str(exported)))
    with paddle.no_grad():
        logits = [model.eval()(ids)[0].numpy() for model in (start, trained, saved)]
    assert np.abs(logits[1] - logits[0]).max() > 1e-4  # the step changed the policy
    np.testing.assert_allclose(logits[2], logits[1], atol=1e-5)


@pytest.mark.slow
def test_a_tensor_parallel_step_of_the_family_equals_one_process(family_model, tiny_world, tmp_path):
    # The entropy bonus gives the random policy a gradient whatever its rewards.
    changes = {"actor_model_name_or_path": family_model, "entropy_coeff": 0.01}
    one = first_step(tiny_world, tmp_path, "one", processes=1, **changes)
    two = first_step(tiny_world, tmp_path, "two", processes=2, data_ranks=1, tensor_parallel_degree=2, **changes)
    log = (tmp_path / "two_log" / "workerlog.0").read_text(errors="replace")
    assert any("tensor-parallel ranks" in line and "ForCausalLM" in line for line in log.splitlines())  # split, not copied
    assert one["grad_norm"] > 1e-3
    for key in ("loss/policy_avg", "grad_norm", "entropy"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    names = sorted(one["weights"])
    np.testing.assert_allclose([two["weights"][n] for n in names], [one["weights"][n] for n in names], rtol=1e-6, atol=1e-5)


def test_a_lora_actor_of_the_family_trains_its_adapters_and_merges(family_model, tiny_world, tmp_path):
    run_ppo.main([TINY_CONFIG, *small_run_argv(
        tiny_world, str(tmp_path), actor_model_name_or_path=family_model, use_rm_server="false", use_rule_reward="true",
        lora="true", lora_rank=4, learning_rate=5e-3, entropy_coeff=0.01, max_steps=1, eval_datasets="",
        lora_save_merged="true",
    )])
    assert {"lora_config.json", "lora_model_state.pdparams"} <= set(os.listdir(tmp_path / "policy"))
    ids = paddle.to_tensor([[3, 17, 5, 28, 9]])
    with paddle.no_grad():
        base, merged = (pretrained_causal_lm(path, dtype="float32").eval()(ids)[0].numpy() for path in (family_model, str(tmp_path / "policy_merged")))
    assert np.abs(merged - base).max() > 1e-5


def test_the_predictor_decodes_the_family_greedily(family_model, tiny_world, tmp_path):
    output = tmp_path / "out.jsonl"
    # No --dtype: the bfloat16 folder decodes in float32 on CPU, which has no bfloat16 matmul.
    predictor.main(argv(model_name_or_path=family_model, data_file=tiny_world["eval"], output_file=output,
                        max_length=6, batch_size=4))
    tokenizer, model = load_tokenizer(family_model), pretrained_causal_lm(family_model, dtype="float32").eval()
    for row in [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()][:4]:
        ids = tokenizer(row["src"], add_special_tokens=False)["input_ids"]
        for _ in range(6):  # greedy by full forwards of the plain model
            with paddle.no_grad():
                ids.append(int(model(paddle.to_tensor([ids]))[0][0, -1].argmax()))
        expected = ids[-6:]
        if tokenizer.eos_token_id in expected:
            expected = expected[: expected.index(tokenizer.eos_token_id)]
        assert row["output"] == tokenizer.decode(expected)
