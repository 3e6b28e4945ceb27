"""A property whose case the machine cannot hold (tests/test_crash_containment.py runs it)."""

from hypothesis import given
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import DecodeCase, build


@given(case=st.just(DecodeCase(lengths=(1,), spare_pages=2**46)))  # a pool of 2**46 pages: 64 PB of K and V
def test_a_case_too_large_for_the_machine(impl, device, case):
    impl(*build(case, device))
