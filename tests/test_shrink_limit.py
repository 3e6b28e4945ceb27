"""A failure's shrink is bounded by --shrink-limit and by a spent --time-budget (``runner/shrink_limit.py``)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as hypothesis_engine

from gqa_decode_fuzz.record import casefiles
from gqa_decode_fuzz.runner.shrink_limit import ShrinkLimit
from tests.pytest_runs import run_module, run_pytest

CENTRAL = "test_output_and_lse_within_error_bound"


def shrink(limit_s: float | None = None, deadline: float | None = None, **grace) -> tuple[list[int], list[str], int]:
    """A property that fails once its list sums to 100 or more, its shrink bounded by ``limit_s`` and
    ``deadline`` (``ShrinkLimit``'s): the reported failing list, the notes on its error, and how many examples
    ran."""
    ran: list[list[int]] = []

    @settings(database=None, derandomize=True, max_examples=100)
    @given(st.lists(st.integers(0, 1000), min_size=5, max_size=5))
    def prop(values):
        ran.append(values)
        assert sum(values) < 100

    with pytest.raises(AssertionError) as failure, ShrinkLimit(limit_s, deadline, **grace).applied(
            SimpleNamespace(obj=prop)):
        prop()
    return ran[-1], getattr(failure.value, "__notes__", []), len(ran)


def cut_notes(notes: list[str]) -> list[str]:
    return [said for said in notes if said.startswith("gqa-decode: shrinking stopped")]


def test_a_shrink_past_its_limit_reports_the_failure_found_so_far_and_says_so():
    smallest, notes, runs = shrink()
    assert smallest == [0, 0, 0, 0, 100] and not cut_notes(notes)
    found, notes, cut_runs = shrink(limit_s=0)
    assert sum(found) >= 100 and found != smallest  # a real failure, replayed, but not shrunk to the end
    assert cut_runs < runs
    [note] = cut_notes(notes)
    assert "--shrink-limit=0" in note


def test_a_spent_time_budget_stops_the_shrink_after_its_grace():
    found, notes, _ = shrink(deadline=time.time() - 60, past_deadline_s=0)
    assert found != [0, 0, 0, 0, 100]
    [note] = cut_notes(notes)
    assert "--time-budget" in note
    # A failure found just as the budget ends still gets its grace to shrink.
    found, notes, _ = shrink(deadline=time.time() - 60)
    assert found == [0, 0, 0, 0, 100] and not cut_notes(notes)


def test_hypothesis_keeps_its_own_limit_outside_a_bounded_item():
    own = hypothesis_engine.MAX_SHRINKING_SECONDS
    shrink(limit_s=0)
    assert hypothesis_engine.MAX_SHRINKING_SECONDS == own


def test_the_option_cuts_a_slow_shrink_in_a_pytest_run():
    args = ("tests/shrink_limit_cases.py", "-p", "no:xdist", "-q", "-s", "--run-report=none", "--isolation=off",
            "--device=cpu")
    run = run_pytest(*args, "--shrink-limit=1")
    assert "1 failed" in run.stdout, run.stdout[-3000:]
    assert "gqa-decode: shrinking stopped at --shrink-limit=1 (1.0 s)" in run.stdout, run.stdout[-3000:]
    examples_cut = run.stdout.count("example [")
    whole = run_pytest(*args)
    assert "1 failed" in whole.stdout and "shrinking stopped" not in whole.stdout, whole.stdout[-3000:]
    assert examples_cut < whole.stdout.count("example [")


def test_a_cut_shrink_is_named_in_the_case_file_and_the_run_report(tmp_path):
    run = run_pytest(f"properties/test_decode.py::{CENTRAL}", "-p", "no:xdist", "-q",
                     "--impl=tests/impls/slow_wrong_kv_head.py:run", "--isolation=off", "--device=cpu",
                     "--hypothesis-profile=ci", "--max-examples=40", "--shrink-limit=1",
                     f"--failures-dir={tmp_path / 'failures'}", f"--run-report={tmp_path / 'reports'}")
    assert "1 failed" in run.stdout, run.stdout[-3000:]
    [case_file] = (tmp_path / "failures").glob("*.pt")
    assert "gqa-decode: shrinking stopped at --shrink-limit=1" in casefiles.load_case(case_file)["error"]
    replay = run_module("gqa_decode_fuzz.record.repro", str(case_file), "--device", "cpu", "--no-png")
    assert "shrink   : shrinking stopped at --shrink-limit=1 (1.0 s)" in replay.stdout, replay.stdout[-2000:]
    [report] = (tmp_path / "reports").glob("*/report.md")
    assert "  - shrinking stopped at --shrink-limit=1 (1.0 s)" in report.read_text(), report.read_text()[-3000:]
    entries = json.loads((report.parent / "report.json").read_text())  # what check --json reads
    assert entries[f"properties/test_decode.py::{CENTRAL}"]["shrink_cut"].startswith("gqa-decode: shrinking stopped")


def test_a_shrink_that_ends_within_its_limit_is_not_noted_however_long_the_search_went_on():
    """Hypothesis goes on searching for other bugs after the first failure, before it shrinks: that search does
    not count against the shrink's limit, and a shrink that ends on its own says nothing."""
    calls = []

    @settings(database=None, derandomize=True, max_examples=400)
    @given(st.integers(0, 1000))
    def prop(value):
        calls.append(value)
        time.sleep(0.02)
        assert len(calls) < 60 or value == 0  # fails from the 60th call on; shrinks to 0 at once

    with pytest.raises(AssertionError) as failure, ShrinkLimit(0.5, None).applied(SimpleNamespace(obj=prop)):
        prop()
    assert len(calls) > 90  # the search after the first failure alone outlasted the limit (30 x 20 ms > 0.5 s)
    assert not cut_notes(getattr(failure.value, "__notes__", []))
