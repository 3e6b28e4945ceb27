"""A pytest plugin for tests/test_impl_option.py: the xdist controller writes, when it starts its workers, which of
torch, Triton and the kernel it has imported by then (one name a line) to the file ``SPAWN_IMPORTS_LOG`` names."""

import os
import sys

import pytest


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs) -> None:
    imported = [name for name in ("torch", "triton", "gqa_decode_fuzz.kernel") if name in sys.modules]
    with open(os.environ["SPAWN_IMPORTS_LOG"], "w", encoding="utf-8") as log:
        log.write("".join(f"{name}\n" for name in imported) or "none\n")
