"""Models created from safetensors folders, each parameter from its tensor, and under tensor parallel each
rank reading only its part.

The model is built under Paddle's LazyGuard (no parameter allocated) and split by the tensor-parallel plan
(tensor_parallel.py; nothing to split at degree 1); each parameter is then created holding only this rank's
slice, read from the files through safetensors' slices. A rank so holds its part of the weights and one
slice in flight, never the whole model (benchmarks/bench_tp_loading.py), and no parameter is randomly
initialised first. Both layouts of safetensors folders load this way: Hugging Face's (hf_layout.py: renamed,
matrices transposed) and paddlenlp's own. Parameters the plan leaves whole (norms; the embedding and LM
head when the vocabulary is not split) are read whole on every rank.
"""

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed.auto_parallel.api import dtensor_from_local
from paddlenlp.utils.log import logger
from safetensors import safe_open

from paddle_alignment.models.hf_layout import (
    build_model,
    by_file,
    initialize_fresh_parts,
    is_transposed,
    safetensors_files,
    tensor_index,
    weight_files,
)
from paddle_alignment.models.tensor_parallel import shard_model


def load_hf_folder(folder, class_for_config, **options):
    """The model of the Hugging Face-layout `folder`: the class `class_for_config(config)` built from its
    config.json with `options` (what paddlenlp's from_pretrained takes: dtype, config attributes, and the
    model's own keyword arguments), its parameters created from the safetensors. A score head the folder
    lacks (a causal LM's folder given to a score model) gets a fresh initialisation, as with paddlenlp;
    any other missing parameter is an error naming it."""
    return load_split(folder, class_for_config, options, 1, weight_files(folder), hf_layout=True)


def load_split(folder, class_for_config, options, degree, paths, hf_layout):
    """The model of `folder` (its safetensors `paths`; `hf_layout`: in Hugging Face's layout) built by
    `class_for_config(config)` with from_pretrained's `options`, split over `degree` tensor-parallel ranks."""
    model = build_model(folder, class_for_config, options)
    index = tensor_index(folder, paths, model, hf_layout)
    initialize_fresh_parts(model, index)
    model = shard_model(model, degree)
    fill_from_files(model, index, hf_layout)
    if degree > 1:
        logger.info(f"{type(model).__name__} loaded from {folder}: this rank read only its part of the split tensors")
    else:
        logger.info(f"loaded {type(model).__name__} from the {'Hugging Face' if hf_layout else 'paddlenlp'}-layout folder {folder}")
    return model


def load_into(model, folder):
    """Give `model`, built and split already (a trainer's model resuming a checkpoint), the weights of the
    safetensors `folder` (save_model's), each rank reading only its slices."""
    found = safetensors_files(folder)
    if not found:
        raise ValueError(f"{folder} holds no safetensors weights to resume {type(model).__name__} from")
    paths, hf_layout = found
    fill_from_files(model, tensor_index(folder, paths, model, hf_layout), hf_layout)
    logger.info(f"{type(model).__name__} resumed from {folder}: this rank read only its part of the split tensors")


def fill_from_files(model, index, hf_layout):
    """Each parameter of `model` that `index` (tensor_index) names, from this rank's part of its tensor."""
    targets = model.state_dict()
    for path, entries in by_file(index):
        with safe_open(path, framework="paddle") as f:
            for name, key in entries:
                fill_part(targets[name], f.get_slice(key), name, f"{key} of {path}", hf_layout)


def fill_part(target, file_slice, name, where, hf_layout):
    """Create `target` (a parameter of a lazily built model, split or whole) from this rank's part of
    `file_slice` (safetensors' lazy view of the tensor `where` names), in the memory read for it."""
    shape = list(file_slice.get_shape())
    transposed = hf_layout and is_transposed(name, shape)
    if (shape[::-1] if transposed else shape) != list(target.shape):
        raise ValueError(f"{where} has shape {shape}; {name} needs {list(target.shape)}")
    bounds = local_bounds(target)
    read = file_slice[tuple(bounds[::-1] if transposed else bounds)]
    # safetensors reads onto the host: the slice moves to the model's device, then takes its dtype there.
    part = (read.T if transposed else read).to(paddle.device.get_device()).astype(target.dtype).contiguous()
    if part.data_ptr() == read.data_ptr():
        # Still the file's memory-mapped pages (a CPU tensor of the file's dtype and layout): a parameter kept
        # there keeps the whole mapping alive, and every page read from the file stays in the process's RSS
        # (1.4 GB of Qwen2.5-0.5B's 2 GB file after loading). The parameter gets memory of its own.
        part = part.clone()
    if target.is_dist():
        part = dtensor_from_local(part, target.process_mesh, target.placements)
    part._share_underline_tensor_to(target)


def local_bounds(tensor):
    """The slices of `tensor`'s whole value that this rank holds: along each dimension a mesh axis shards,
    this rank's even share, axis by axis (Paddle's placements)."""
    bounds = [slice(0, size) for size in tensor.shape]
    if not tensor.is_dist():
        return bounds
    mesh = tensor.process_mesh
    coordinates = np.unravel_index(mesh.process_ids.index(dist.get_rank()), mesh.shape)
    for axis, placement in enumerate(tensor.placements):
        if not placement.is_shard():
            continue
        dim, parts = placement.get_dim(), mesh.shape[axis]
        start, stop = bounds[dim].start, bounds[dim].stop
        if (stop - start) % parts:
            raise ValueError(f"a dimension of {stop - start} does not split evenly over {parts} ranks")
        size = (stop - start) // parts
        bounds[dim] = slice(start + coordinates[axis] * size, start + (coordinates[axis] + 1) * size)
    return bounds
