"""LoRA actors on the tiny config: only the adapters train, the reference log-probs are the base model's
(adapters switched off, no second copy), adapters are saved and resumed, and a merged copy loads as a
plain model."""

import json
import os

import numpy as np
import paddle
import pytest
from paddlenlp.peft import LoRAModel
from paddlenlp.transformers import AutoModelForCausalLM

from helpers import REPO_ROOT, small_run_argv
from llm.alignment.ppo import run_ppo
from llm.predict import predictor
from paddle_alignment.models.loading import load_policy
from paddle_alignment.rollout.decode import SamplingConfig, generate_rollouts

TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")
# The entropy bonus moves the adapters whatever the rewards: the tiny world's model may answer every prompt of
# three steps wrongly, leaving GRPO no advantage (and the KL term has no gradient while the adapters are zero).
LORA = {"use_rm_server": False, "use_rule_reward": True, "lora": True, "lora_rank": 4, "learning_rate": 5e-3,
        "kl_loss_coeff": 0.05, "entropy_coeff": 0.01, "save_steps": 2, "max_eval_samples": 8, "eval_steps": 100,
        "offload_level": "freeze_model optimizer train_model"}


def lora_argv(world, output_dir, **changes):
    return small_run_argv(world, str(output_dir), **{**LORA, **changes})


@pytest.fixture(scope="module")
def lora_run(tiny_world, tmp_path_factory):
    """Three GRPO steps of a LoRA actor with a KL term, saving the merged policy too (every offload scope
    opened on the way: a no-op on CPU)."""
    output_dir = tmp_path_factory.mktemp("lora_run")
    run_ppo.main([TINY_CONFIG, *lora_argv(tiny_world, output_dir, lora_save_merged=True)])
    return output_dir


def load_lora_actor(world, adapters):
    return LoRAModel.from_pretrained(AutoModelForCausalLM.from_pretrained(world["model"]), adapters)


def test_lora_actor_trains_only_its_adapters(tiny_world, lora_run):
    assert {"lora_config.json", "lora_model_state.pdparams"} <= set(os.listdir(lora_run / "policy"))
    actor = load_lora_actor(tiny_world, str(lora_run / "policy"))
    base = AutoModelForCausalLM.from_pretrained(tiny_world["model"]).state_dict()
    state = actor.model.state_dict()
    adapters = [k for k in state if "lora_B" in k]
    assert adapters and all(float(state[k].abs().max()) > 0 for k in adapters)  # lora_B starts at zero
    assert all(np.array_equal(state[k].numpy(), base[k].numpy()) for k in base)  # base weights untouched


def test_reference_logprobs_are_the_base_models(tiny_world, lora_run, tmp_path):
    trainer = run_ppo.build_trainer(
        [TINY_CONFIG, *lora_argv(tiny_world, tmp_path, lora_path=str(lora_run / "policy"))]
    )
    assert trainer.reference_model is None  # no second copy of the weights
    items = [trainer.train_dataset[i] for i in range(4)]
    exp = generate_rollouts(trainer.model, trainer.tokenizer, items, 2, SamplingConfig(max_dec_len=4))
    base = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    base.eval()
    reference = trainer.rollout.worker.compute_reference_logprobs(exp)
    np.testing.assert_allclose(reference.numpy(), trainer.rollout.worker.compute_logprobs(base, exp).numpy(), atol=1e-5)
    # The adapters are back on afterwards: the actor's own log-probs differ from the base model's.
    actor = trainer.rollout.worker.compute_logprobs(trainer.model, exp)
    assert float((actor - reference).abs().max()) > 1e-3


def test_merged_policy_loads_as_a_plain_model_with_the_adapters_output(tiny_world, lora_run):
    merged = AutoModelForCausalLM.from_pretrained(str(lora_run / "policy_merged"))
    actor = load_lora_actor(tiny_world, str(lora_run / "policy"))
    assert not any("lora" in key for key in merged.state_dict())
    input_ids = paddle.to_tensor([[5, 17, 99, 42, 7]])
    merged.eval(), actor.eval()
    np.testing.assert_allclose(merged(input_ids)[0].numpy(), actor(input_ids)[0].numpy(), atol=1e-4)


def test_lora_resume_continues_from_the_checkpoint_adapters(tiny_world, lora_run, tmp_path):
    resumed = run_ppo.build_trainer(
        [TINY_CONFIG, *lora_argv(tiny_world, tmp_path, resume_from_checkpoint=str(lora_run / "checkpoint-2"))]
    )
    saved = load_lora_actor(tiny_world, str(lora_run / "checkpoint-2" / "policy")).model.state_dict()
    state = resumed.model.model.state_dict()
    assert all(np.array_equal(state[k].numpy(), saved[k].numpy()) for k in saved if "lora_" in k)


def test_lora_keys_without_lora_are_rejected(tiny_world, tmp_path):
    with pytest.raises(ValueError, match="lora_save_merged=True applies to LoRA adapters: set lora true"):
        run_ppo.build_trainer([TINY_CONFIG, *lora_argv(tiny_world, tmp_path, lora=False, lora_save_merged=True)])


def predicted(world, data_file, output_file, *flags):
    predictor.main(["--data_file", data_file, "--output_file", output_file, "--max_length", "6", "--batch_size", "4", *flags])
    return [json.loads(line)["output"] for line in open(output_file, encoding="utf-8")]


def test_the_predictor_applies_adapters_given_as_lora_path(tiny_world, lora_run, tmp_path):
    # PaddleNLP's --lora_path: the base model with a LoRA run's adapters predicts as the run's merged policy.
    with_adapters = ["--model_name_or_path", tiny_world["model"], "--lora_path", str(lora_run / "policy")]
    model, _ = load_policy(tiny_world["model"], str(lora_run / "policy"))
    merged = AutoModelForCausalLM.from_pretrained(str(lora_run / "policy_merged"))
    base = AutoModelForCausalLM.from_pretrained(tiny_world["model"])
    merged.eval(), base.eval()
    input_ids = paddle.to_tensor([[5, 17, 99, 42, 7]])
    logits = model(input_ids)[0].numpy()
    np.testing.assert_allclose(logits, merged(input_ids)[0].numpy(), atol=1e-5)
    assert np.abs(logits - base(input_ids)[0].numpy()).max() > 1e-3
    # Decoded end to end (the fast decode loop), the outputs are the merged policy's.
    data_file = tiny_world["eval"]
    assert predicted(tiny_world, data_file, str(tmp_path / "a.jsonl"), *with_adapters) == predicted(
        tiny_world, data_file, str(tmp_path / "m.jsonl"), "--model_name_or_path", str(lora_run / "policy_merged")
    )


def test_the_predictor_names_an_adapters_folder_given_as_the_model(tiny_world, lora_run):
    with pytest.raises(ValueError, match="holds LoRA adapters only: give the base model as --model_name_or_path"):
        predictor.main(["--model_name_or_path", str(lora_run / "policy"), "--chat"])
    with pytest.raises(ValueError, match=r"--lora_path .* not a folder of LoRA adapters \(lora_config.json missing\)"):
        predictor.main(["--model_name_or_path", tiny_world["model"], "--lora_path", tiny_world["model"], "--chat"])
