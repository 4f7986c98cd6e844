"""GPU build of the rollout ops: `python csrc/setup_cuda.py install` (needs paddlepaddle-gpu and nvcc).

The same `paddlenlp_ops` package as setup_cpu.py; GPU tensors run the CUDA kernels of gpu/, CPU
tensors the CPU kernels. Set CUDA_ARCH (e.g. "90" for H100/H200) to build for one architecture.
"""

import glob
import os

from paddle.utils.cpp_extension import CUDAExtension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
os.chdir(HERE)  # paddle's builder resolves sources and build folders from the working directory

ARCHS = os.environ.get("CUDA_ARCH", "80,90").split(",")
NVCC_FLAGS = ["-O3", "-std=c++17", "-DROLLOUT_OPS_WITH_CUDA"] + [
    f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS
]

setup(
    name="paddlenlp_ops",
    ext_modules=CUDAExtension(
        sources=["rollout_ops.cc", "gpu/rollout_kernels.cu"],
        include_dirs=[HERE],
        depends=sorted(glob.glob("common/*.h") + glob.glob("gpu/*.h") + glob.glob("gpu/*.cuh")),  # a changed header rebuilds the ops
        extra_compile_args={"cxx": ["-O3", "-std=c++17", "-DROLLOUT_OPS_WITH_CUDA"], "nvcc": NVCC_FLAGS},
    ),
)
