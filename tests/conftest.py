import pytest

from helpers import build_tiny_world, train_reward_model


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    return build_tiny_world(str(tmp_path_factory.mktemp("tiny_world")))


@pytest.fixture(scope="session")
def tiny_reward_model(tiny_world, tmp_path_factory):
    """A reward model trained from the tiny world's SFT model on its preference pairs: (path, eval metrics)."""
    output_dir = str(tmp_path_factory.mktemp("reward_model"))
    return output_dir, train_reward_model(tiny_world, output_dir)
