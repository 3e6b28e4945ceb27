"""A Hypothesis test whose shrink takes several seconds, run by tests/test_shrink_limit.py in a pytest of its own
(not collected here) with --shrink-limit."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st


@settings(database=None, derandomize=True, max_examples=50)
@given(st.lists(st.integers(0, 1000), min_size=8, max_size=8))
def test_slow_to_shrink(values):
    time.sleep(0.1)
    print(f"example {values}")
    assert sum(values) < 100
