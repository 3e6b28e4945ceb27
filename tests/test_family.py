"""The whole family through the property suite: the project's kernel green on every built-in definition, and a
definition read from a file (other constants) running from ``--definition=path``.

CI runs the ci profile at a few examples per property and definition (ten definitions, two cores); the H200 runs
the gpu profile on each (docs/gpu.md).
"""

import pytest

from gqa_decode_fuzz.reference.definitions import BUILT_IN
from tests.pytest_runs import clean_environment, run_pytest

OTHER = "tests/definitions/gqa_paged_decode_h16_kv2_d128_ps16.json"


def _suite(tmp_path, *args: str):
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    return run_pytest("-n", "0", "--hypothesis-profile=ci", "-q", *args, env=env, timeout=2400)


@pytest.mark.parametrize("page_size", [1, 64])
def test_the_kernel_is_green_on_every_built_in_definition(tmp_path, page_size):
    names = ",".join(name for name, d in BUILT_IN.items() if d.page_size == page_size)
    result = _suite(tmp_path, "properties", "--max-examples=4", f"--definition={names}")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert f"definition {names.replace(',', ', ')}" in result.stdout


@pytest.mark.parametrize("impl", ["kernel:run", "tests/impls/torch_float32.py:run"])
def test_a_definition_file_with_other_constants_runs(tmp_path, impl):
    result = _suite(tmp_path, "properties", "--max-examples=6", f"--definition={OTHER}", f"--impl={impl}",
                    "--contract=correct", "-m", "not input_validation" if "torch" in impl else "")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert "definition gqa_paged_decode_h16_kv2_d128_ps16" in result.stdout


def test_an_implementation_that_serves_one_definition_cannot_run_several(tmp_path):
    result = _suite(tmp_path, "properties/test_decode.py", "--impl=tests/impls/nonpositive_scale_nan.py:run",
                    "--definition=all")
    assert result.returncode == 4, result.stdout + result.stderr  # a usage error, before any test
    assert "declares no for_definition" in result.stdout + result.stderr


def test_a_definition_that_is_not_gqa_decode_is_a_usage_error(tmp_path):
    bad = tmp_path / "mla.json"
    bad.write_text('{"name": "mla_paged_decode_h16_ckv512_kpe64_ps1", "op_type": "mla_paged"}')
    result = _suite(tmp_path, "properties/test_decode.py", f"--definition={bad}")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "op_type 'mla_paged' is not supported" in result.stdout + result.stderr
