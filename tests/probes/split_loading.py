"""Models loaded at tensor_parallel_degree 2 from safetensors folders, each rank reading only its part
(models/split_loading.py), against the same folders loaded whole and then split; under
`paddle.distributed.launch --nproc_per_node 2`:

    python tests/probes/split_loading.py OUT.json FOLDERS.json CONFIG.json [--key value ...]

FOLDERS.json names the folders ({label: path}). Each rank writes OUT.json.rank<R>: per folder, the largest
difference of its parameters' local parts between the two loads and of the two models' logits, the
parameters it loaded split, and the critic's (a score model from the same folder) score head, whose values
must be the same on both ranks.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from paddle_alignment.config.arguments import parse_arguments  # noqa: E402
from paddle_alignment.distributed import finish_distributed_run  # noqa: E402
from paddle_alignment.models.loading import (  # noqa: E402
    causal_lm_class, from_folder, load_causal_lm, load_options, load_score_model, with_cpu_kernels,
)
from paddle_alignment.models.tensor_parallel import local_value, shard_model, whole  # noqa: E402


def local_parts(model):
    return {name: local_value(tensor).astype("float32").numpy() for name, tensor in model.state_dict().items()}


def logits(model):
    ids = paddle.to_tensor([[1, 5, 9, 13, 17, 21]], dtype="int64")
    return whole(model(ids, return_dict=True).logits).numpy()


def compare(folder, training_args):
    split_model = load_causal_lm(folder, training_args)
    split = local_parts(split_model)
    whole_model = from_folder(folder, causal_lm_class, load_options(training_args))
    shapes = {name: list(tensor.shape) for name, tensor in whole_model.state_dict().items()}
    reference_model = with_cpu_kernels(shard_model(whole_model, 2), training_args)  # the kernels load_causal_lm adds
    reference = local_parts(reference_model)
    critic = load_score_model(folder, training_args, score_type="critic")
    return {
        "max_difference": max(float(np.abs(split[name] - reference[name]).max()) for name in reference),
        # A tied LM head must be the loaded embedding after the split, not a parameter the load never filled.
        "logits_difference": float(np.abs(logits(split_model) - logits(reference_model)).max()),
        "names": sorted(split) == sorted(reference),
        "split_parameters": sorted(name for name, value in split.items() if list(value.shape) != shapes[name]),
        "score_head": local_value(critic.score_head.weight).numpy().ravel().tolist(),
    }


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        folders = json.load(f)
    _, _, training_args = parse_arguments(sys.argv[3:])
    with paddle.no_grad():
        result = {label: compare(folder, training_args) for label, folder in folders.items()}
    with open(f"{sys.argv[1]}.rank{dist.get_rank()}", "w") as f:
        json.dump(result, f)
    finish_distributed_run()
