"""Hypothesis profiles and case sizes, registered in one place.

Every profile names its parent explicitly: Hypothesis auto-loads its built-in
``ci`` profile when ``CI`` is set, and a profile registered without ``parent=``
would inherit from whichever profile happens to be active.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from .strategies import SizeLimits

DATABASE_DIR = Path(__file__).resolve().parent.parent / ".hypothesis" / "examples"

# Sizes follow the device, not the profile, so that a database entry found by one
# profile replays under another on the same kind of machine.
CASE_SIZES = {
    "small": SizeLimits(max_batch=4, max_len=300, max_spare_pages=512),
    "large": SizeLimits(max_batch=16, max_len=2048, max_spare_pages=8192),
}

PROFILE_DOCS = {
    "dev": "local default: 40 examples, local example database",
    "ci": "CPU interpreter in CI: 40 examples, derandomized, no database",
    "gpu": "GPU box: 300 examples, local example database",
    "nightly": "nightly GPU job: 5000 examples, target-guided, local example database",
    "repro": "replays the example database only (explicit and reuse phases)",
}


def register_profiles() -> None:
    """Register dev, ci, gpu, nightly and repro, each with the pristine default as parent."""
    base = settings.get_profile("default")
    database = DirectoryBasedExampleDatabase(str(DATABASE_DIR))
    common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", parent=base, max_examples=40, database=database, **common)
    settings.register_profile("ci", parent=base, max_examples=40, derandomize=True, database=None, **common)
    settings.register_profile("gpu", parent=base, max_examples=300, database=database, **common)
    settings.register_profile("nightly", parent=base, max_examples=5000, database=database, **common)
    settings.register_profile(
        "repro", parent=base, database=database, phases=(Phase.explicit, Phase.reuse), **common
    )


def default_profile() -> str:
    """``ci`` when the CI variable is set (as CI services do), else ``dev``."""
    return "ci" if os.environ.get("CI") else "dev"
