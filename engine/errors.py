"""The usage errors of ``--device`` and ``--impl``, apart from ``target`` so that ``solutions`` (which ``target``
imports) can raise them too.
"""

from __future__ import annotations

__all__ = ["DeviceError", "ImplSpecError"]


class DeviceError(ValueError):
    """A device choice this machine cannot honour; the message names the fix."""


class ImplSpecError(ValueError):
    """An ``--impl`` value that names no callable; the message says which part failed."""
