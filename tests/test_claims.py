"""Claims declared where the test is (``property_claim``), checked at collection and at run time, and resolved
again from the reference a run records (properties/claims.py, runner/suite_run.py, record/causes.py)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gqa_decode_fuzz.generation.cases import DecodeCase, build
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.record import casefiles, causes
from tests.pytest_runs import ROOT, clean_environment

SUITE_MODULES = sorted(path.stem for path in (ROOT / "properties").glob("test_*.py"))


def _declared(test) -> list[str]:
    return [mark.args[0] for mark in getattr(test, "pytestmark", []) if mark.name == "claim"]


CLAIM_MODULES = ("gqa_decode_fuzz.properties.claims", "gqa_decode_fuzz.properties.prefill_claims")  # by op type


def test_property_modules_import_without_a_run_and_every_test_declares_a_claim_that_resolves():
    """A test module reads no run state when imported (its strategies resolve the run's limits when they first
    draw), and each test function in it declares one claim, which imports back from its reference."""
    assert len(SUITE_MODULES) >= 9, SUITE_MODULES
    for name in SUITE_MODULES:
        module = importlib.import_module(f"gqa_decode_fuzz.properties.{name}")
        tests = [value for key, value in vars(module).items() if key.startswith("test_") and callable(value)]
        assert tests, name
        for test in tests:
            (reference,) = _declared(test)
            assert reference.partition(":")[0] in CLAIM_MODULES, (name, test.__name__, reference)
            assert causes.claim_at(reference).reference == reference


def _names_used(function: ast.FunctionDef, helpers: dict[str, ast.FunctionDef]) -> set[str]:
    """The dotted names ``function``'s body uses (``claims.within_bound``; not its decorators'), with those of the
    module's functions it calls."""
    def body(of: ast.FunctionDef) -> list[ast.AST]:
        return [node for statement in of.body for node in ast.walk(statement)]

    called = {node.func.id for node in body(function)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers}
    return {ast.unparse(node) for of in (function, *(helpers[name] for name in called))
            for node in body(of) if isinstance(node, ast.Attribute)}


def test_every_property_body_goes_through_the_claim_it_declares():
    """The run checks the claim a body calls against the one it declares, but not that it calls one: a body that
    checks by hand judges what its claim would not (the huge pools' body once failed a refused strided layout,
    which its claim allows), and the cause probes replay the claim, not the body. GPU-only properties never run in
    CI, so this reads the source."""
    for name in SUITE_MODULES:
        tree = ast.parse((ROOT / "properties" / f"{name}.py").read_text(encoding="utf-8"))
        helpers = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        for test in (node for key, node in helpers.items() if key.startswith("test_")):
            (declared,) = [ast.unparse(decorator.args[0]) for decorator in test.decorator_list
                           if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "property_claim"]
            assert declared in _names_used(test, helpers), f"{name}::{test.name} declares {declared} but never uses it"


def test_property_claim_takes_only_a_claim():
    with pytest.raises(TypeError, match="property_claim"):
        claims.property_claim(lambda *args: None)


def test_a_claim_resolves_from_its_reference_and_a_bad_reference_is_named():
    assert causes.claim_at(claims.within_bound.reference) is claims.within_bound
    assert causes.claim_at(claims.bad_input_handled.reference).decided_by_draws
    assert not claims.within_bound.decided_by_draws
    for reference in ("gqa_decode_fuzz.properties.claims:no_such_claim", "no_such_module:within_bound",
                      "gqa_decode_fuzz.properties.claims:property_claim"):
        with pytest.raises(causes.ClaimReferenceError, match=reference.partition(":")[2]):
            causes.claim_at(reference)


def test_runner_and_record_import_no_property_module():
    """The root causes and the merge of report parts find claims by reference: importing them (and the runner's
    run) loads no module of the properties."""
    code = ("import sys; import gqa_decode_fuzz.record.report_merge, gqa_decode_fuzz.record.causes, "
            "gqa_decode_fuzz.runner.suite_run, gqa_decode_fuzz.runner.plugin; "
            "print(sorted(m for m in sys.modules if m.startswith('gqa_decode_fuzz.properties')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=clean_environment())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_a_case_file_records_its_property_claim_and_its_failure_takes_it(tmp_path):
    recorder = casefiles.Recorder()
    recorder.begin("properties/test_x.py::test_y", claims.relabelled.reference)
    case = DecodeCase(lengths=(2,))
    recorder.note_claim(case, {"relabel_seed": 3}, claims.relabelled.reference)
    recorder.note_build(case, build(case))
    path = casefiles.save_case(tmp_path, recorder, error="AssertionError: off", impl_spec="x:run",
                               device=torch.device("cpu"), profile="ci", run_id="r")
    assert casefiles.load_case(path)["property_claim"] == claims.relabelled.reference
    (failure,) = causes.failures_of_run(casefiles.runs_index(tmp_path, "r"), [])
    assert (failure.claim, failure.case, failure.draws) == (claims.relabelled.reference, case, {"relabel_seed": 3})


def test_a_case_file_from_before_claims_were_recorded_is_read_but_not_probed(tmp_path):
    """An old case file (no ``property_claim``) still gives its case and draws; its failure is a cause of its own,
    saying why it was not probed, rather than a guess at its claim."""
    recorder = casefiles.Recorder()
    recorder.begin("properties/test_decode.py::test_output_and_lse_within_error_bound")
    case = DecodeCase(lengths=(1,), scale=0.0)
    recorder.note_build(case, build(case))
    path = casefiles.save_case(tmp_path, recorder, error="AssertionError: off", impl_spec="x:run",
                               device=torch.device("cpu"), profile="ci", run_id="r")
    payload = casefiles.load_case(path)
    del payload["property_claim"]
    torch.save(payload, path)
    (failure,) = causes.failures_of_run(casefiles.runs_index(tmp_path, "r"), [])
    assert failure.case == case and failure.claim is None and not failure.probeable
    prober = causes.Prober(lambda *args: None, torch.device("cpu"), "correct")
    (cause,) = causes.find_causes([failure], prober)
    assert "names no claim" in cause.note and not prober.tried



def _raising(error: Exception):
    def impl(*args):
        raise error
    return impl


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("torch.OutOfMemoryError: CUDA out of memory (isolated child)"),
                                   RuntimeError("Triton Error [CUDA]: out of memory")])  # a kernel's load, full GPU
def test_running_out_of_memory_is_never_a_refusal(error):
    """Where a claim allows a refusal, an out-of-memory error propagates as itself (the runner's shared-GPU rule
    makes it the run's limit): read as a refusal, strict failed it as unclear and the other tiers passed it."""
    case = DecodeCase(lengths=(2,), q_layout="strided_dim")
    for contract in ("strict", "correct"):
        with pytest.raises(type(error), match="out of memory"):
            claims.right_answer_or_clear_error(_raising(error), case, "cpu", contract)
        with pytest.raises(type(error), match="out of memory"):
            claims.bad_input_handled(_raising(error), DecodeCase(lengths=(2,)), "cpu", contract)
    claims.right_answer_or_clear_error(_raising(ValueError("q: a strided layout")), case, "cpu", "strict")

# ---- the plugin: collection and run time --------------------------------------------------------------------

_RUN = """
import sys
from pathlib import Path

from gqa_decode_fuzz.runner import shards

shards.PROPERTY_SUITE = Path.cwd().resolve()  # this folder's test files are the property suite's
import pytest

sys.exit(pytest.main(["-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--run-report=none",
                      "--failures-dir=failures", *sys.argv[1:]]))
"""

_HEADER = """
from hypothesis import example, given

from gqa_decode_fuzz.generation.cases import DecodeCase
from gqa_decode_fuzz.generation.strategies import decode_cases, run_sized
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.claims import property_claim
"""


def _run_suite(folder: Path, source: str) -> subprocess.CompletedProcess:
    """pytest on one test file in ``folder``, which the plugin takes for the property suite."""
    (folder / "test_props.py").write_text(_HEADER + textwrap.dedent(source))
    return subprocess.run([sys.executable, "-c", _RUN, "test_props.py", "--max-examples=2"], cwd=folder,
                          capture_output=True, text=True, timeout=600, env=clean_environment(CI="true"))


def test_a_property_without_a_claim_fails_collection_naming_it(tmp_path):
    result = _run_suite(tmp_path, """
        @property_claim(claims.within_bound)
        @given(case=run_sized(lambda limits: decode_cases(limits=limits)))
        def test_declared(impl, device, contract, case):
            claims.within_bound(impl, case, device, contract)


        @given(case=run_sized(lambda limits: decode_cases(limits=limits)))
        def test_undeclared(impl, device, contract, case):
            claims.within_bound(impl, case, device, contract)
    """)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "test_props.py::test_undeclared: a property declares the claim its body checks" in output, output
    assert "test_declared:" not in output


def test_a_body_that_calls_no_claim_fails_naming_it(tmp_path):
    """Checking by hand in a body that declares a claim fails as a defect of the test, unshrunk."""
    result = _run_suite(tmp_path, """
        @property_claim(claims.within_bound)
        @given(case=run_sized(lambda limits: decode_cases(limits=limits)))
        def test_by_hand(impl, device, contract, case):
            from gqa_decode_fuzz.generation.cases import build

            impl(*build(case, device))
    """)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert ("test_props.py::test_by_hand declares @property_claim(gqa_decode_fuzz.properties.claims:within_bound) "
            "but an example of its body called no claim") in output, output
    assert "Falsifying" not in output


def test_a_body_calling_another_claim_than_it_declares_fails_naming_both(tmp_path):
    result = _run_suite(tmp_path, """
        @property_claim(claims.within_bound)
        @given(case=run_sized(lambda limits: decode_cases(limits=limits)))
        @example(case=DecodeCase(lengths=(2,)))
        def test_misdeclared(impl, device, contract, case):
            claims.relabelled(impl, case, device, contract)


        @property_claim(claims.relabelled)
        @given(case=run_sized(lambda limits: decode_cases(limits=limits)))
        def test_declared(impl, device, contract, case):
            claims.relabelled(impl, case, device, contract)
    """)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert ("test_props.py::test_misdeclared declares @property_claim(gqa_decode_fuzz.properties.claims:"
            "within_bound) but its body calls the claim gqa_decode_fuzz.properties.claims:relabelled") in output, output
    assert "1 failed, 1 passed" in output, output
    assert "Falsifying" not in output  # a defect of the test: not shrunk as a failure of the implementation
