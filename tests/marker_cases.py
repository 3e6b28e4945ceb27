"""Tests whose parameter ids are the names of the suite's skip markers, run by tests/test_skip_markers.py in a
pytest of its own (not collected here): only a marker skips a test, never a parameter's id."""

import pytest


@pytest.mark.parametrize("name", ["gpu", "strict", "paged"])
def test_a_parameter_named_like_a_marker(name):
    assert name
