"""What this pytest session tests, and where: set once by conftest.py at configure time.

Strategies are built when test modules are imported, after configuration, so the
case sizes can follow the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .strategies import SizeLimits


@dataclass(frozen=True)
class Session:
    """What is under test and where, and where failures and reports go."""

    impl_spec: str
    impl: Callable
    device: torch.device
    sizes: str
    limits: SizeLimits
    run_id: str = "local"
    failures_dir: Path = Path("failures")
    report_dir: Path | None = None  # None: no run report
    worker: str | None = None  # the xdist worker id, None without xdist


_current: Session | None = None


def configure(session: Session) -> None:
    global _current
    _current = session


def current() -> Session:
    """The session conftest.py configured; fails clearly when used outside pytest."""
    if _current is None:
        raise RuntimeError("properties.session is set by conftest.py; run the suite through pytest")
    return _current
