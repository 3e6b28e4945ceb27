"""A pytest plugin for tests/test_impl_option.py: the xdist controller tells its workers the run is on CUDA
(as a GPU host's controller does), so a worker that sees no CUDA device shows what it then does."""

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure_node(node) -> None:
    node.workerinput["gqa_decode_device"] = "cuda"
