"""A script with paddle's sharding stages 2 and 3 (group_sharded_parallel, levels os_g and p_g_os) running on
CPU processes:

    python -m paddle.distributed.launch --nproc_per_node 2 tests/probes/group_sharded_on_cpu.py SCRIPT [ARGS ...]

Paddle 3.3's group-sharded stages are its GPU engine, and refuse a CPU build at points that are not their work:
- device asserts: group_sharded_parallel's place check, "Only support CUDA / XPU" in GroupShardedStage3 and
  GroupShardedOptimizerStage2 (here: `core` answers that it was compiled with CUDA);
- a device id read from the device's name, `gpu:N` ("cpu" has none: here "cpu:0");
- host-device copies: `tensor.cpu()` is, on CPU, the tensor itself, which the stages then clear (here: a
  copy); `cvt_to_device` knows no CPU place (here: a copy on the CPU); the global-norm clip moves its norm to
  the GPU with `tensor.cuda()` before reducing it (here: it stays).
Past those, the slicing and owning of parameters, the gathers, reductions and broadcasts over gloo, the
optimizer steps and global-norm clip on slices and owned parameters and the gathering for saves are paddle's
own, as on GPUs. Stage 3 slices every parameter of more than SEGMENT_SIZE elements (the tiny models' weights;
their biases and norms stay whole, as stage 3 leaves small parameters). The run's layout check accepts stages
2 and 3 on CPU.
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from paddle_alignment.cpu_runtime import configure_cpu_runtime  # noqa: E402

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle  # noqa: E402
from paddle.distributed import sharding  # noqa: E402
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_optimizer_stage2 as optimizer_stage2  # noqa: E402
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage2 as stage2  # noqa: E402
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as stage3  # noqa: E402
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_storage as storage  # noqa: E402

from paddle_alignment.config import layout  # noqa: E402

SEGMENT_SIZE = 256


class Replaced:
    """`module`, but for the attributes given."""

    def __init__(self, module, **attributes):
        self._module, self._attributes = module, attributes

    def __getattr__(self, name):
        return self._attributes[name] if name in self._attributes else getattr(self._module, name)


def group_sharded_parallel(model, optimizer, level, scaler=None, group=None, offload=False, sync_buffers=False,
                           buffer_max_size=2**23, segment_size=2**20, sync_comm=False, dp_group=None, exclude_layer=None):
    """paddle's group_sharded_parallel on the CPU device."""
    if level == "os_g":
        optimizer = optimizer_stage2.GroupShardedOptimizerStage2(
            params=optimizer._parameter_list, optim=optimizer, group=group, offload=offload, dp_group=dp_group, device="cpu",
        )
        model = stage2.GroupShardedStage2(
            model, optimizer, group=group, sync_buffers=sync_buffers, buffer_max_size=buffer_max_size, dp_group=dp_group,
            device="cpu",
        )
    else:
        model = stage3.GroupShardedStage3(
            model, optimizer=optimizer, group=group, sync_buffers=sync_buffers, segment_size=SEGMENT_SIZE,
            offload=offload, sync_comm=sync_comm, dp_group=dp_group, device="cpu", exclude_layer=exclude_layer,
        )
    return model, optimizer, scaler


def compiled_with_cuda():
    return True


host_of = paddle.Tensor.cpu
paddle.Tensor.cpu = lambda tensor: host_of(tensor).clone() if tensor.place.is_cpu_place() else host_of(tensor)
storage.cvt_to_device = lambda tensor, device_id, blocking=True: tensor._copy_to(paddle.CPUPlace(), blocking)
for module in (stage3, optimizer_stage2):
    module.core = Replaced(module.core, is_compiled_with_cuda=compiled_with_cuda)
    module.paddle = Replaced(paddle, get_device=lambda: "cpu:0")
paddle.Tensor.cuda = lambda tensor, *args, **kwargs: tensor
sharding.group_sharded_parallel = group_sharded_parallel
check_parallel_degrees = layout.check_parallel_degrees
layout.check_parallel_degrees = lambda args, world_size, on_accelerator: check_parallel_degrees(args, world_size, True)

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
