"""How large drawn cases get: a module of its own, importing neither torch nor Hypothesis, so that the plugin can
name the case sizes (``--case-sizes``) in a process that never builds a case (the xdist controller)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SizeLimits"]


@dataclass(frozen=True)
class SizeLimits:
    """How large drawn cases get; set per profile (CPU interpreter runs stay small)."""

    max_batch: int = 4
    max_len: int = 300
    max_spare_pages: int = 512
