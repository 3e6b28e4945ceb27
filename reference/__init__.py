"""The float64 oracle, its error bound, the comparison that reports mismatches, and the contract's constants."""

from .compare import Mismatch, assert_within_bound, check_against_reference
from .oracle import DEFAULT_SM_SCALE, GROUP, HEAD_DIM, NUM_KV_HEADS, NUM_QO_HEADS, Reference, attend, float32_scale

__all__ = [
    "DEFAULT_SM_SCALE", "GROUP", "HEAD_DIM", "Mismatch", "NUM_KV_HEADS", "NUM_QO_HEADS", "Reference",
    "assert_within_bound", "attend", "check_against_reference", "float32_scale",
]
