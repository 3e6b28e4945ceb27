"""The contract: its definitions (``definitions``), the float64 oracle, its error bound, and the comparison that
reports mismatches.

``definitions`` imports no torch; the rest is imported on first use, so that an xdist controller can read
``--definition`` before it imports torch.
"""

import importlib

_LAZY = {
    "Mismatch": "compare", "assert_within_bound": "compare", "check_against_reference": "compare",
    "Reference": "oracle", "attend": "oracle", "float32_scale": "oracle",
}

__all__ = ["Mismatch", "Reference", "assert_within_bound", "attend", "check_against_reference", "float32_scale"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
