"""One failing property gives one FAILED line and one case file, however many shards run it.

The first shard to fail claims the property and shrinks its counterexample; its sibling
shards stop drawing examples (skipped, "stopped: ... failed first"), also in other
xdist workers. The run report counts the shards that stopped.
"""

import json

import pytest

from tests.pytest_runs import clean_environment, run_pytest

PROPERTY = "properties/test_decode.py::test_output_and_lse_within_error_bound"
NATURAL_LSE = (
    "import math\n"
    "from tests.impls.torch_float32 import run as correct\n"
    "def run(*args):\n"
    "    output, lse = correct(*args)\n"
    "    return output, lse * math.log(2.0)\n"
)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_bug_seen_by_every_shard_is_reported_once(tmp_path, workers):
    (tmp_path / "natural_lse.py").write_text(NATURAL_LSE)
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR=str(tmp_path / "reports"))
    result = run_pytest(PROPERTY, "-n", workers, "--shards=4", "--hypothesis-profile=ci", "-rfs",
                        f"--impl={tmp_path / 'natural_lse.py'}:run", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1, output
    assert "3 skipped" in result.stdout and "failed first and reports this property" in result.stdout, output
    assert len(list((tmp_path / "failures").glob("*.pt"))) == 1
    (report,) = (tmp_path / "reports").glob("*/report.json")
    entry = json.loads(report.read_text())[PROPERTY]
    assert entry["verdict"] == "failed" and entry["case_file"], entry
