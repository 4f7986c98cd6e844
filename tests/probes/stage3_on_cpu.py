"""A script with paddle's sharding stage 3 (group_sharded_parallel, level p_g_os) running on CPU processes:

    python -m paddle.distributed.launch --nproc_per_node 2 tests/probes/stage3_on_cpu.py SCRIPT [ARGS ...]

Paddle 3.3's stage 3 is its GPU engine, and it refuses a CPU build at three points that are not its work: two
device asserts (group_sharded_parallel's, GroupShardedStage3's "Only support CUDA / XPU") and `_device2cpu`,
whose device-to-host copy is, on CPU, the tensor itself, which it then clears. Past those, the slicing, the
gathers and reductions over gloo, the optimizer step on slices and the gathering for saves are paddle's own,
as on GPUs. This probe replaces the three, slices every parameter of more than SEGMENT_SIZE elements (the
tiny models' weights; their biases and norms stay whole, as stage 3 leaves small parameters), and lets the
run's layout check accept stage 3 on CPU. Paddle's global-norm clip for stage 3 reads a GPU device id: runs
through this probe set max_grad_norm 0.
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle  # noqa: E402
from paddle.distributed import sharding  # noqa: E402
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as stage3  # noqa: E402

from paddle_alignment.config import arguments  # noqa: E402

SEGMENT_SIZE = 256


class CompiledForDevices:
    """Paddle's `core` module, but for its answer to is_compiled_with_cuda."""

    def __init__(self, core):
        self._core = core

    def is_compiled_with_cuda(self):
        return True

    def __getattr__(self, name):
        return getattr(self._core, name)


def group_sharded_parallel(model, optimizer, level, scaler=None, group=None, offload=False, sync_buffers=False,
                           buffer_max_size=2**23, segment_size=2**20, sync_comm=False, dp_group=None, exclude_layer=None):
    """paddle's group_sharded_parallel for level p_g_os, on the CPU device."""
    assert level == "p_g_os", f"this probe runs stage 3 only, not {level}"
    model = stage3.GroupShardedStage3(
        model, optimizer=optimizer, group=group, sync_buffers=sync_buffers, segment_size=SEGMENT_SIZE, offload=offload,
        sync_comm=sync_comm, dp_group=dp_group, device="cpu", exclude_layer=exclude_layer,
    )
    return model, optimizer, scaler


def host_copy(tensor, convert_dtype=False):
    return (paddle.cast(tensor, "float32") if convert_dtype else tensor).clone()


check_parallel_degrees = arguments.check_parallel_degrees
stage3.core = CompiledForDevices(stage3.core)
stage3._device2cpu = host_copy
sharding.group_sharded_parallel = group_sharded_parallel
arguments.check_parallel_degrees = lambda args, world_size, on_accelerator: check_parallel_degrees(args, world_size, True)

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
