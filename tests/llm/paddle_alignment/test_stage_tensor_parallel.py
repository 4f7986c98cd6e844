"""What a pipeline stage's tensor-parallel weights are: a block of the whole weight along the one axis whose
length differs (the end-to-end equality with one process is in tests/llm/alignment/ppo/test_pipeline_parallel.py)."""

import re

import pytest

from paddle_alignment.stage_tensor_parallel import split_axis


@pytest.mark.parametrize(
    "part, whole, axis",
    [
        ([64, 32], [64, 64], 1),  # q_proj's columns (ColumnParallelLinear)
        ([32, 64], [64, 64], 0),  # o_proj's rows (RowParallelLinear)
        ([500, 64], [1000, 64], 0),  # the embedding's vocabulary (VocabParallelEmbedding)
        ([64], [64], None),  # a norm, whole on every rank
    ],
)
def test_a_stage_weight_is_split_along_the_axis_whose_length_differs(part, whole, axis):
    assert split_axis(part, whole) == axis


@pytest.mark.parametrize("part, whole", [([32, 32], [64, 64]), ([64], [64, 64])])
def test_a_weight_that_is_no_block_of_the_whole_is_refused(part, whole):
    with pytest.raises(ValueError, match=re.escape(f"a stage's weight of shape {part} is no block of the whole {whole}")):
        split_axis(part, whole)
