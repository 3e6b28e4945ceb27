"""Hypothesis properties split into shards, and one report per failing property.

A ``@given`` test is one pytest item and xdist spreads items, never examples. Each
property in ``properties/`` is therefore parametrized into shards (one per worker by
default); a shard runs its share of the examples with its own seed, so shards explore
different examples even under a derandomized profile. Shards share their property's
example-database key, so an example saved by any shard replays in every later run.

When a shard finds a failing example it claims the property (an atomic marker file
in the run's directory); its siblings stop drawing examples (they end as skipped,
"stopped"), and a sibling that finds a failure after the claim stops instead of
shrinking it again. So a wrong kernel gives one FAILED line, one shrunk
counterexample and one case file per property, however many shards ran it.

This module, ``engine/examples.py`` (the shard id format, the running example) and ``shrink_limit.py`` (the
engine's shrink time) are the places that touch Hypothesis's private attributes (settings, seed and database
digest of a test).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.errors import HypothesisException

from gqa_decode_fuzz.engine.examples import Shard, property_name

__all__ = [
    "FailureClaims", "generates_examples", "in_suite", "is_hypothesis_test", "is_property", "profile_name",
    "resolved_shard_count", "share_database_key", "shard_settings", "sharded", "wrapping_examples",
]

PROPERTY_SUITE = Path(__file__).resolve().parent.parent / "properties"  # the tests that are split into shards


def resolved_shard_count(option: int | str) -> int:
    """The number of shards ``--shards`` means in this process."""
    if option == "auto":
        return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    return int(option)


def is_hypothesis_test(function: object) -> bool:
    return bool(getattr(function, "is_hypothesis_test", False))


def in_suite(path: Path | str) -> bool:
    """Whether a test file is one of the suite's own (under ``properties/``)."""
    return Path(path).resolve().is_relative_to(PROPERTY_SUITE)


def is_property(function: object, path: Path | str) -> bool:
    """Whether a test is one of the suite's properties: a Hypothesis test in ``properties/``."""
    return is_hypothesis_test(function) and in_suite(path)


def generates_examples(function: object) -> bool:
    """False for a replay-only profile: every shard would replay the same database entries."""
    return Phase.generate in _own_settings(function).phases


def _own_settings(function: object) -> settings:
    return getattr(function, "__func__", function)._hypothesis_internal_use_settings


def _seed(test_id: str, shard: Shard | None, forced_seed: object) -> int:
    text = f"{test_id}|{shard}|{forced_seed}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def shard_settings(own: settings, *, shard: Shard | None, profile_max_examples: int,
                   max_examples: int | None) -> settings:
    """The settings one shard runs under: its share of the test's examples (rescaled by ``--max-examples``), and
    the test's explicit examples (``@example``, ``--workloads``' lines) in its first shard only: they are the same
    in every shard, and some are the costliest examples there are (huge pools, taken in the GPU's memory turn)."""
    wanted = own.max_examples
    if max_examples is not None:
        wanted = max(1, round(own.max_examples * max_examples / max(profile_max_examples, 1)))
    count = shard.count if shard else 1
    phases = own.phases if shard is None or shard.index == 0 else tuple(
        phase for phase in own.phases if phase is not Phase.explicit)
    return settings(own, max_examples=max(1, math.ceil(wanted / count)), phases=phases)


@contextlib.contextmanager
def sharded(
    test, test_id: str, *, shard: Shard | None, profile_max_examples: int, max_examples: int | None,
    forced_seed: object = None,
) -> Iterator[None]:
    """Run a ``@given`` test as one shard: its share of examples and, where runs are
    reproducible (derandomized profile or ``--hypothesis-seed``), a seed of its own.

    ``test`` is the function Hypothesis wrapped; its settings are restored afterwards.
    """
    function = getattr(test, "__func__", test)
    own = function._hypothesis_internal_use_settings
    saved_seed = function._hypothesis_internal_use_seed
    function._hypothesis_internal_use_settings = shard_settings(
        own, shard=shard, profile_max_examples=profile_max_examples, max_examples=max_examples
    )
    if shard is not None and saved_seed is None and (own.derandomize or forced_seed is not None):
        # Otherwise every shard would draw the same examples from the same seed.
        function._hypothesis_internal_use_seed = _seed(test_id, shard, forced_seed)
    try:
        yield
    finally:
        function._hypothesis_internal_use_settings = own
        function._hypothesis_internal_use_seed = saved_seed


def share_database_key(item: pytest.Item) -> None:
    """Key a sharded item's examples by its property, not its node id (Hypothesis keys parametrized
    items by node id), so an example saved under any shard count replays in every later run."""
    inner = item.obj.hypothesis.inner_test
    name = property_name(item.nodeid)
    if "[" in name:  # parametrized apart from the shard: keep that part of the key
        inner._hypothesis_internal_add_digest = name.encode()
    elif hasattr(inner, "_hypothesis_internal_add_digest"):
        del inner._hypothesis_internal_add_digest


class FailureClaims:
    """Which properties have failed in this run, shared by every process through marker files.

    ``directory`` is the run's own (the controller creates it and its workers inherit it).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _marker(self, prop: str) -> Path:
        return self.directory / hashlib.sha1(prop.encode()).hexdigest()

    def claim(self, prop: str, nodeid: str) -> bool:
        """True for the first shard to fail in ``prop`` (it reports the property); False afterwards."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(self._marker(prop), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as marker:
            marker.write(nodeid)
        return True

    def owner(self, prop: str) -> str | None:
        """The node id of the shard that claimed ``prop``, or None."""
        try:
            return self._marker(prop).read_text() or "?"
        except FileNotFoundError:
            return None

    def watching(self, item: pytest.Item) -> contextlib.AbstractContextManager:
        """Run ``item`` (a sharded property) so that it claims its property at its first failure, and stops
        drawing examples, as skipped, once a sibling shard has claimed it."""
        prop, nodeid = property_name(item.nodeid), item.nodeid

        def watch(inner):
            @functools.wraps(inner)
            def watched(*args, **kwargs):
                owner = self.owner(prop)
                if owner is not None and owner != nodeid:
                    pytest.skip(f"stopped: {owner} failed first and reports this property")
                try:
                    return inner(*args, **kwargs)
                except HypothesisException:
                    raise  # assume(), unsatisfiable draws: not a failure
                except Exception:
                    if self.owner(prop) is None:
                        self.claim(prop, nodeid)
                    if self.owner(prop) != nodeid:
                        pytest.skip(f"stopped: failed too, but {self.owner(prop)} failed first and reports "
                                    "this property")
                    raise

            return watched

        return wrapping_examples(item, watch)


@contextlib.contextmanager
def wrapping_examples(item: pytest.Item, wrap) -> Iterator[None]:
    """Run each Hypothesis example of ``item`` through ``wrap(example)`` (Hypothesis's documented hook,
    ``.hypothesis.inner_test``), restoring it afterwards."""
    handle = item.obj.hypothesis
    inner = handle.inner_test
    handle.inner_test = wrap(inner)
    try:
        yield
    finally:
        handle.inner_test = inner


def profile_name() -> str:
    """The active Hypothesis profile's name."""
    # get_current_profile_name() is recent; the GPU image may carry an older Hypothesis.
    getter = getattr(settings, "get_current_profile_name", None)
    return getter() if getter else getattr(settings, "_current_profile", "?")
