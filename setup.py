"""paddle-alignment: RLHF for PaddlePaddle (PPO, GRPO and friends), laid out like PaddleNLP's llm/."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def requirements(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


setup(
    name="paddle-alignment",
    version="0.1.0",
    description="Align large language models with reinforcement learning on PaddlePaddle",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read() if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    # Only the shared core is installed, under this project's own name: the top-level name `llm` belongs to
    # a popular PyPI package. The entry scripts under llm/ run from the repository, as PaddleNLP's do.
    package_dir={"paddle_alignment": "llm/paddle_alignment"},
    packages=["paddle_alignment"] + [f"paddle_alignment.{name}" for name in find_packages("llm/paddle_alignment")],
    python_requires=">=3.9",
    install_requires=requirements("requirements.txt"),
    extras_require={"test": ["pytest==9.2.0", "pytest-xdist==3.8.0"]},
)
