"""The float64 oracle, its error bound, and the comparison that reports mismatches."""

from .compare import Mismatch, assert_within_bound, check_against_reference
from .oracle import Reference, attend, float32_scale

__all__ = ["Mismatch", "Reference", "assert_within_bound", "attend", "check_against_reference", "float32_scale"]
