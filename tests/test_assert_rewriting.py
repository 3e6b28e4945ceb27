"""Hypothesis's modules are imported as they are, not through pytest's assert rewriting (runner/assert_rewriting.py)."""

import importlib
import sys

import hypothesis
import hypothesis.core
import pytest

from gqa_decode_fuzz.runner.assert_rewriting import leave_unrewritten


def _loader_of(name: str) -> str:
    return type(importlib.import_module(name).__loader__).__name__


def _package(root, name: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    (root / name / "inner.py").write_text("def check(x):\n    assert x\n")


def test_hypothesis_is_not_rewritten_in_the_suites_processes():
    assert _loader_of(hypothesis.__name__) != "AssertionRewritingHook"
    assert _loader_of(hypothesis.core.__name__) != "AssertionRewritingHook"


def test_a_package_left_unrewritten_imports_plainly_and_a_marked_one_does_not(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("probe_rewritten", "probe_left_plain"):
        _package(tmp_path, name)
        pytest.register_assert_rewrite(name)
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert leave_unrewritten("probe_left_plain")
    assert _loader_of("probe_rewritten.inner") == "AssertionRewritingHook"  # the control: pytest rewrites it
    assert _loader_of("probe_left_plain.inner") == "SourceFileLoader"
    for name in ("probe_rewritten", "probe_rewritten.inner", "probe_left_plain", "probe_left_plain.inner"):
        sys.modules.pop(name, None)


def test_without_pytests_hook_nothing_is_done(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [hook for hook in sys.meta_path
                                           if type(hook).__name__ != "AssertionRewritingHook"])
    assert not leave_unrewritten("hypothesis")
