"""Two properties run by tests/test_mps.py in a pytest of their own (not collected here).

With tests/impls/mps_neighbour_fault.py the first crashes on its first example but its
case passes when replayed alone; the second's case faults again.
"""

from hypothesis import given, settings

from gqa_decode_fuzz.generation.cases import build
from gqa_decode_fuzz.generation.strategies import SizeLimits, decode_cases

SMALL = SizeLimits(max_batch=3, max_len=12, max_spare_pages=4)


@settings(max_examples=5)
@given(case=decode_cases(limits=SMALL).filter(lambda case: case.batch == 1))
def test_hit_by_a_neighbours_fault(impl, device, case):
    impl(*build(case, device))


@settings(max_examples=30)
@given(case=decode_cases(limits=SMALL).filter(lambda case: case.batch >= 2))
def test_kernel_faults(impl, device, case):
    impl(*build(case, device))
