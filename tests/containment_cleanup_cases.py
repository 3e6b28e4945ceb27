"""A property whose cleanup raises an ordinary error after a fault (tests/test_crash_containment.py runs it).

Like a ``finally: torch.cuda.empty_cache()`` on a poisoned context: the cleanup's error
must not replace the lost context, or Hypothesis would shrink in a dead context and
the session would go on.
"""

from hypothesis import given, settings

from gqa_decode_fuzz.generation.cases import build
from gqa_decode_fuzz.generation.strategies import SizeLimits, decode_cases

SMALL = SizeLimits(max_batch=3, max_len=12, max_spare_pages=4)


@settings(max_examples=30)
@given(case=decode_cases(limits=SMALL))
def test_kernel_faults_and_cleanup_raises(impl, device, case):
    try:
        impl(*build(case, device))
    except BaseException:  # as torch.cuda.empty_cache() in a cleanup fails on a poisoned context
        raise RuntimeError("cleanup failed: the allocator cannot release memory") from None


@settings(max_examples=5)
@given(case=decode_cases(limits=SMALL))
def test_not_reached(impl, device, case):
    impl(*build(case, device))
