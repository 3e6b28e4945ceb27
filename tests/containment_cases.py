"""Two properties run by tests/test_crash_containment.py in a pytest of their own (not collected here).

With tests/impls/simulated_cuda_fault.py the first faults; the second never
triggers the fault, so it passes only in a process whose context is not poisoned.
"""

from hypothesis import given, settings

from gqa_decode_fuzz.generation.cases import build
from gqa_decode_fuzz.generation.strategies import SizeLimits, decode_cases

SMALL = SizeLimits(max_batch=3, max_len=12, max_spare_pages=4)


@settings(max_examples=30)
@given(case=decode_cases(limits=SMALL))
def test_first_kernel_faults(impl, device, case):
    impl(*build(case, device))


@settings(max_examples=5)
@given(case=decode_cases(limits=SMALL).filter(lambda case: case.batch == 1))
def test_second_runs_in_a_healthy_process(impl, device, case):
    impl(*build(case, device))
