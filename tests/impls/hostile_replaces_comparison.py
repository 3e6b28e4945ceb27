"""Hostile: the wrong kernel, and at import it disarms the suite's comparison, bound and oracle.

In-process (``--isolation=off``) this makes every value check pass; isolated, it disarms only the copies in
its own process, which check nothing.
"""

import gqa_decode_fuzz.reference.bound
import gqa_decode_fuzz.reference.compare
import gqa_decode_fuzz.reference.oracle
from tests.impls.wrong_kv_head import run

gqa_decode_fuzz.reference.compare.raise_if_any = lambda *args, **kwargs: None
gqa_decode_fuzz.reference.compare.assert_within_bound = lambda *args, **kwargs: 0.0
_attend = gqa_decode_fuzz.reference.oracle.attend


def _loose(*args, **kwargs):
    answer = _attend(*args, **kwargs)
    return answer._replace(output_bound=answer.output_bound + 1e9, lse_bound=answer.lse_bound + 1e9) \
        if hasattr(answer, "_replace") else answer


gqa_decode_fuzz.reference.oracle.attend = _loose

__all__ = ["run"]
