"""Hostile: computes the right answer when it believes it is being tested, the wrong kernel's otherwise.

It looks where a kernel inside a pytest run could: the environment (``PYTEST_*``, ``GQA_DECODE_*``,
``HYPOTHESIS*``), the modules loaded (pytest, Hypothesis, xdist), the call stack (a pytest or Hypothesis
frame) and ``sys.argv``. In-process it finds all of them and passes; the isolated child starts with none.
"""

import os
import sys
import traceback

from tests.impls.wrong_kv_head import correct
from tests.impls.wrong_kv_head import run as wrong

_SIGNS = ("pytest", "hypothesis", "xdist", "_pytest")


def under_test() -> bool:
    """Whether anything in this process says it runs under a test."""
    if any(name.startswith(("PYTEST_", "GQA_DECODE_", "HYPOTHESIS")) for name in os.environ):
        return True
    if any(sign in sys.modules for sign in _SIGNS):
        return True
    if any(sign in frame.filename for frame in traceback.extract_stack() for sign in _SIGNS):
        return True
    return any(sign in argument for argument in sys.argv for sign in _SIGNS)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    serve = correct if under_test() else wrong
    return serve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
