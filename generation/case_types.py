"""``Case``: a descriptor of either op type, for the signatures (case files, root causes, the run report) that take
whichever a property drew."""

from __future__ import annotations

from .cases import DecodeCase
from .prefill_cases import PrefillCase

__all__ = ["Case"]

Case = DecodeCase | PrefillCase
