"""A pytest plugin for measuring: xdist's own ``NodeManager.setup_nodes`` put back, so that a run whose workers a
warm server forks makes their gateways one after another, as xdist does, instead of at once
(``warm_workers.start_gateways_at_once``). Changes nothing else:

    pytest -p benchmarks.sequential_gateways properties -n auto ...
    python benchmarks/throughput.py startup --device cuda --workers auto -- -p benchmarks.sequential_gateways

``-p`` imports it before the suite's plugin configures, so what it keeps is xdist's own method.
"""

from __future__ import annotations

import pytest
from xdist.workermanage import NodeManager

_XDISTS_OWN = NodeManager.setup_nodes


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Before xdist sets up its nodes (its own hook runs last)."""
    NodeManager.setup_nodes = _XDISTS_OWN
