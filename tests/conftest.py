import pytest

from helpers import build_tiny_world


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    return build_tiny_world(str(tmp_path_factory.mktemp("tiny_world")))
