from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before helpers import paddle

import pytest  # noqa: E402

from helpers import DEMO_WORLD, build_real_world, build_tiny_world, first_step, train_reward_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    return build_tiny_world(str(tmp_path_factory.mktemp("tiny_world")))


@pytest.fixture(scope="session")
def one_process_first_step(tiny_world, tmp_path_factory):
    """algorithm -> the first step of tests/probes/grpo_first_step.py in one process on the tiny world's 8
    prompts (helpers.first_step), run once per session: every layout's step is compared with it."""
    steps = {}

    def step(algorithm):
        if algorithm not in steps:
            steps[algorithm] = first_step(tiny_world, tmp_path_factory.mktemp(f"one_{algorithm}"), "one", processes=1, rl_algorithm=algorithm)
        return steps[algorithm]

    return step


@pytest.fixture(scope="session")
def tiny_reward_model(tiny_world, tmp_path_factory):
    """A reward model briefly trained from the tiny world's SFT model on its preference pairs, for the
    mechanics of reward-model rewards and critics: (path, eval metrics)."""
    output_dir = str(tmp_path_factory.mktemp("reward_model"))
    return output_dir, train_reward_model(tiny_world, output_dir, max_steps=60)


@pytest.fixture(scope="session")
def demo_world(tmp_path_factory):
    """The tiny demo's world (4-layer model, its data and SFT): slow to build, for the stage tests."""
    return build_tiny_world(str(tmp_path_factory.mktemp("demo_world")), **DEMO_WORLD)


@pytest.fixture(scope="session")
def demo_reward_model(demo_world, tmp_path_factory):
    """Stage 2 of the tiny pipeline on the demo's world, as config/tiny/rm_argument.json sets it: (path, eval metrics)."""
    output_dir = str(tmp_path_factory.mktemp("demo_reward_model"))
    return output_dir, train_reward_model(demo_world, output_dir)


@pytest.fixture(scope="session")
def real_world(tmp_path_factory):
    """Qwen2.5-0.5B's shape (2 layers, vocabulary 151,936) in Hugging Face's layout, and its data."""
    return build_real_world(str(tmp_path_factory.mktemp("real_world")))
