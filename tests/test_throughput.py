"""benchmarks/throughput.py's draws mode: generation's floor, which docs/performance.md quotes."""

import importlib.util

from tests.pytest_runs import ROOT

_SPEC = importlib.util.spec_from_file_location("throughput", ROOT / "benchmarks" / "throughput.py")
throughput = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(throughput)


def test_the_floor_draws_the_suites_decode_cases_and_times_each():
    assert throughput.draw_floor("small", 20) > 0.0
