"""Run by tests/test_shrink_memory.py in a pytest of its own (not collected here): two failing ``@example``s
and a passing one after them, so the last case built is not the failure Hypothesis reports."""

from hypothesis import example, given
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import DecodeCase, build
from gqa_decode_fuzz.properties.checks import run_and_check


@example(length=3)
@example(length=5)
@example(length=0)  # passes: an empty sequence (the wrong implementation shifts only the LSE of non-empty ones)
@given(length=st.integers(1, 4))
def test_failing_explicit_examples(impl, device, length):
    run_and_check(impl, build(DecodeCase(lengths=(length,)), device), f"length {length}")
