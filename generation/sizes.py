"""How large drawn cases get: a module of its own, importing neither torch nor Hypothesis, so that the plugin can
name the case sizes (``--case-sizes``) in a process that never builds a case (the xdist controller)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SizeLimits"]


@dataclass(frozen=True)
class SizeLimits:
    """How large drawn cases get; set per profile (CPU interpreter runs stay small). ``max_len`` bounds a decode
    sequence; causal prefill draws at most ``max_q_len`` queries and ``max_kv_len`` keys per sequence, and at most
    ``max_prefill_batch`` sequences (its work grows as queries times keys)."""

    max_batch: int = 4
    max_len: int = 300
    max_spare_pages: int = 512
    max_q_len: int = 34
    max_kv_len: int = 136
    max_prefill_batch: int = 3
