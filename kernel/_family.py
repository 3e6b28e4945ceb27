"""``for_definition``: the project's kernel of any definition it serves, GQA decode or causal prefill (paged or
ragged); also ``run.for_definition``. Apart from both launchers, which it picks between, so that neither imports
the other's."""

from __future__ import annotations

from collections.abc import Callable

from ._launch import for_decode_definition, run
from ._prefill_launch import for_prefill_definition, prefill_kind

__all__ = ["for_definition"]


def for_definition(definition) -> Callable:
    """The validated kernel of ``definition``: ``for_prefill_definition``'s for a causal prefill definition
    (``op_type``, or its name, says so), else ``for_decode_definition``'s (``run`` itself for the seed's)."""
    if prefill_kind(definition):
        return for_prefill_definition(definition)
    return for_decode_definition(definition)


run.for_definition = for_definition
