"""run_finetune under pipeline parallel, through paddlenlp's own pipes and pipeline loop: the stages train
step for step as tensor parallel does on the same batches, the final model and a checkpoint load whole in one
process, and a PP2 x TP2 run resumed from its checkpoint ends as the uninterrupted run."""

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
    """run_finetune on the tiny world's demonstrations from its random model, 4 steps of 32 rows in 2
    micro-batches; returns the losses rank 0 logged."""
    values = {
        "model_name_or_path": world["random_model"], "dataset_name_or_path": os.path.dirname(world["sft_train"]),
        "max_steps": 4, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "logging_steps": 1,
        "output_dir": tmp_path / run, "logging_dir": tmp_path / run / "vdl", **changes,
    }
    argv = [token for key, value in values.items() for token in (f"--{key}", str(value))]
    logs = launch_two_processes(SFT_CONFIG, argv, tmp_path / f"{run}_log", script=RUN_FINETUNE, processes=processes)
    return [float(line.split(" - loss: ")[1].split(",")[0]) for line in logs[0].splitlines() if "global_step: " in line]


def logits_of(folder):
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    model.eval()
    return model(input_ids=paddle.to_tensor(TOKENS, dtype="int64"), return_dict=True).logits.numpy()


def test_fine_tuning_at_pipeline_parallel_equals_tensor_parallel(tiny_world, tmp_path):
    """PP2 against TP2 (which equals one process), both over 2 processes and so on the same batches (paddlenlp
    shuffles one process's data otherwise): the same losses step by step, and the same saved model."""
    tensor = finetune(tiny_world, tmp_path, "tensor", processes=2, tensor_parallel_degree=2)
    pipeline = finetune(tiny_world, tmp_path, "pipeline", processes=2, pipeline_parallel_degree=2)
    assert len(tensor) == 4 and tensor[0] > tensor[-1]
    np.testing.assert_allclose(pipeline, tensor, rtol=1e-5)
    assert sorted(n for n in os.listdir(tmp_path / "pipeline") if n.endswith(".safetensors")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    ]
    np.testing.assert_allclose(logits_of(tmp_path / "pipeline"), logits_of(tmp_path / "tensor"), rtol=1e-4, atol=1e-4)


def test_fine_tuning_at_pipeline_by_tensor_parallel_resumes_from_its_checkpoint_exactly(tiny_world, tmp_path):
    straight = finetune(tiny_world, tmp_path, "straight", processes=4, pipeline_parallel_degree=2, tensor_parallel_degree=2,
                        save_strategy="steps", save_steps=2)
    checkpoint = tmp_path / "straight" / "checkpoint-2"
    assert sorted(n for n in os.listdir(checkpoint) if n.endswith(".pdopt")) == [
        "optimizer.tp00_pp00.pdopt", "optimizer.tp00_pp01.pdopt", "optimizer.tp01_pp00.pdopt", "optimizer.tp01_pp01.pdopt",
    ]
    logits_of(checkpoint)  # loads whole in one process
    shutil.copytree(checkpoint, tmp_path / "resumed" / "checkpoint-2")
    resumed = finetune(tiny_world, tmp_path, "resumed", processes=4, pipeline_parallel_degree=2, tensor_parallel_degree=2,
                       save_strategy="steps", save_steps=2, resume_from_checkpoint=tmp_path / "resumed" / "checkpoint-2")
    assert resumed == straight[2:]
    np.testing.assert_array_equal(logits_of(tmp_path / "resumed"), logits_of(tmp_path / "straight"))
