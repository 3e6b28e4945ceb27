"""The running Hypothesis example, and the property a test item belongs to.

What a draw inside an example (kernel knobs, the sanitized share), a run report's target scores and the verdict
of a final example read of the running example, and the shard id format (``Shard``) that a node id carries and
``property_name`` strips. The engine draws inside examples and the record groups by property, so both live below
them here; ``runner/shards.py`` splits the properties into shards with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SHRINK_CUT", "Shard", "draw_in", "example_targets", "final_example", "property_name", "running_example"]

SHRINK_CUT = "gqa-decode: shrinking stopped at"  # how the note on a failure whose shrink was cut starts

_SHARD_ID = re.compile(r"shard(\d+)of(\d+)")
_SHARD_PARAMETER = re.compile(r"\[shard\d+of\d+\]$|(?<=\[)shard\d+of\d+-|-shard\d+of\d+(?=\])")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (from 0) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"shard{self.index + 1}of{self.count}"

    @classmethod
    def in_nodeid(cls, nodeid: str) -> Shard | None:
        """The shard a test item's node id names, if any."""
        found = _SHARD_ID.search(nodeid)
        return cls(int(found[1]) - 1, int(found[2])) if found else None


def property_name(nodeid: str) -> str:
    """The property a test item belongs to: its node id without the shard parameter."""
    return _SHARD_PARAMETER.sub("", nodeid)


def running_example() -> object | None:
    """The running Hypothesis example's build context, or None outside one and in an explicit ``@example``
    (whose data holds no choices: a draw there would overrun)."""
    from hypothesis.control import current_build_context

    try:
        context = current_build_context()
    except Exception:  # noqa: BLE001 - outside a Hypothesis test
        return None
    return None if getattr(context.data, "max_choices", None) == 0 else context


def final_example() -> bool:
    """Whether the running example is one Hypothesis reports (an explicit ``@example``, or the shrunk failure
    run once more at the end), not one of the search or the shrink."""
    from hypothesis.control import current_build_context

    try:
        return bool(current_build_context().is_final)
    except Exception:  # noqa: BLE001 - outside a Hypothesis test
        return False


def example_targets() -> dict[str, float]:
    """The ``target()`` scores the running example reported so far, by label (empty outside an example)."""
    example = running_example()
    observations = getattr(getattr(example, "data", None), "target_observations", None) or {}
    return {str(label): float(score) for label, score in observations.items()}


def draw_in(example: object, strategy, label: str):
    """Draw from ``strategy`` inside ``example`` (as ``st.data()`` does): the value shrinks and replays with it."""
    return example.data.draw(strategy, label=label)
