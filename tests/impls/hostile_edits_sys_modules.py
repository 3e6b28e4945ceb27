"""Hostile: the wrong kernel, and at its first call it finds the suite's check modules in ``sys.modules`` (by
what they hold, not by name) and replaces their bound assertion and mismatch raiser with no-ops.

In-process (``--isolation=off``) every value check then passes; isolated, its ``sys.modules`` holds no
checker to edit.
"""

import sys

from tests.impls.wrong_kv_head import run as wrong

_edited = False


def _edit_the_checker() -> None:
    for module in list(sys.modules.values()):
        for name in ("assert_within_bound", "raise_if_any"):
            if callable(getattr(module, name, None)) and "tests.impls" not in getattr(module, "__name__", ""):
                setattr(module, name, lambda *args, **kwargs: 0.0)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    global _edited
    if not _edited:
        _edit_the_checker()
        _edited = True
    return wrong(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
