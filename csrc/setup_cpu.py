"""CPU build of the rollout ops: `python csrc/setup_cpu.py install` -> importable `paddlenlp_ops`."""

import os

from paddle.utils.cpp_extension import CppExtension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
os.chdir(HERE)  # paddle's builder resolves sources and build folders from the working directory

setup(
    name="paddlenlp_ops",
    ext_modules=CppExtension(
        sources=["rollout_ops.cc"],
        include_dirs=[HERE],
        extra_compile_args={"cxx": ["-O3", "-std=c++17"]},
    ),
)
