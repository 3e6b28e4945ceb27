"""Hostile: the wrong kernel, and at import it disarms the suite's comparison, bound and oracle.

In-process (``--isolation=off``) this makes every value check pass; isolated, it disarms only the copies in
its own process, which check nothing.
"""

import reference.bound
import reference.compare
import reference.oracle
from tests.impls.wrong_kv_head import run

reference.compare.raise_if_any = lambda *args, **kwargs: None
reference.compare.assert_within_bound = lambda *args, **kwargs: 0.0
_attend = reference.oracle.attend


def _loose(*args, **kwargs):
    answer = _attend(*args, **kwargs)
    return answer._replace(output_bound=answer.output_bound + 1e9, lse_bound=answer.lse_bound + 1e9) \
        if hasattr(answer, "_replace") else answer


reference.oracle.attend = _loose

__all__ = ["run"]
