"""CPU build of the custom ops: `python csrc/setup_cpu.py install` -> importable `paddlenlp_ops`.

rollout_ops.cc holds the decode loop's sampling ops, fused_ops.cc the model's fused elementwise ops,
optimizer_ops.cc the fused AdamW and gradient-clip ops.
-fopenmp-simd honours the kernels' `#pragma omp simd` without linking an OpenMP runtime;
-fno-trapping-math lets the compiler turn the kernels' float selects into vector blends (nothing here
relies on floating-point traps); -fno-math-errno lets it vectorise sqrt (nothing here reads errno; the
results are the same, sqrt being correctly rounded either way).
"""

import glob
import os

from paddle.utils.cpp_extension import CppExtension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
os.chdir(HERE)  # paddle's builder resolves sources and build folders from the working directory

setup(
    name="paddlenlp_ops",
    ext_modules=CppExtension(
        sources=["rollout_ops.cc", "fused_ops.cc", "attention_ops.cc", "decoder_ops.cc", "optimizer_ops.cc"],
        include_dirs=[HERE],
        depends=sorted(glob.glob("common/*.h")),  # a changed header rebuilds the ops
        extra_compile_args={"cxx": ["-O3", "-std=c++17", "-fopenmp-simd", "-fno-trapping-math", "-fno-math-errno"]},
    ),
)
