"""run_finetune under pipeline parallel, through paddlenlp's own pipes and pipeline loop: the stages train
step for step as tensor parallel does on the same batches, the final model and a checkpoint load whole in one
process, and a run resumed from its checkpoint ends as the uninterrupted run (fleet's tensor-parallel layers
inside the stages are RL's tests, tests/llm/alignment/ppo/test_pipeline_parallel.py)."""

import os
import shutil

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import AutoModelForCausalLM

from helpers import RUN_FINETUNE, SFT_CONFIG, launch_two_processes

pytestmark = pytest.mark.slow

TOKENS = [[5, 17, 23, 9, 40, 2, 11, 30]]


def finetune(world, tmp_path, run, processes, **changes):
    """run_finetune on the tiny world's demonstrations from its random model, 4 steps of 4 rows in 2
    micro-batches (no warmup, so that 4 steps lower the loss), each padded to its own longest row (the widths differ within steps: the pipe pads a step's
    micro-batches to one); returns the losses rank 0 logged."""
    values = {
        "model_name_or_path": world["random_model"], "dataset_name_or_path": os.path.dirname(world["sft_train"]),
        "max_steps": 4, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "logging_steps": 1, "warmup_steps": 0,
        "output_dir": tmp_path / run, "logging_dir": tmp_path / run / "vdl", **changes,
    }
    argv = [token for key, value in values.items() for token in (f"--{key}", str(value))]
    logs = launch_two_processes(SFT_CONFIG, argv, tmp_path / f"{run}_log", script=RUN_FINETUNE, processes=processes)
    return [float(line.split(" - loss: ")[1].split(",")[0]) for line in logs[0].splitlines() if "global_step: " in line]


def logits_of(folder):
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    model.eval()
    return model(input_ids=paddle.to_tensor(TOKENS, dtype="int64"), return_dict=True).logits.numpy()


@pytest.fixture(scope="module")
def pipeline_run(tiny_world, tmp_path_factory):
    """A PP2 fine-tuning run of 4 steps with a checkpoint at step 2: (its folder, its losses)."""
    root = tmp_path_factory.mktemp("finetune_pipeline")
    losses = finetune(tiny_world, root, "pipeline", processes=2, pipeline_parallel_degree=2, save_strategy="steps", save_steps=2)
    return root / "pipeline", losses


def test_fine_tuning_at_pipeline_parallel_equals_tensor_parallel(tiny_world, tmp_path, pipeline_run):
    """PP2 against TP2 (which equals one process), both over 2 processes and so on the same batches (paddlenlp
    shuffles one process's data otherwise): the same losses step by step, and the same saved model."""
    folder, pipeline = pipeline_run
    tensor = finetune(tiny_world, tmp_path, "tensor", processes=2, tensor_parallel_degree=2)
    assert len(tensor) == 4 and tensor[0] > tensor[-1]
    np.testing.assert_allclose(pipeline, tensor, rtol=1e-5)
    assert sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    ]
    np.testing.assert_allclose(logits_of(folder), logits_of(tmp_path / "tensor"), rtol=1e-4, atol=1e-4)


def test_fine_tuning_at_pipeline_parallel_resumes_from_its_checkpoint_exactly(tiny_world, tmp_path, pipeline_run):
    folder, straight = pipeline_run
    checkpoint = folder / "checkpoint-2"
    assert sorted(n for n in os.listdir(checkpoint) if n.endswith(".pdopt")) == ["optimizer.pp00.pdopt", "optimizer.pp01.pdopt"]
    logits_of(checkpoint)  # loads whole in one process
    shutil.copytree(checkpoint, tmp_path / "resumed" / "checkpoint-2")
    resumed = finetune(tiny_world, tmp_path, "resumed", processes=2, pipeline_parallel_degree=2,
                       save_strategy="steps", save_steps=2, resume_from_checkpoint=tmp_path / "resumed" / "checkpoint-2")
    assert resumed == straight[2:]
    np.testing.assert_array_equal(logits_of(tmp_path / "resumed"), logits_of(folder))
