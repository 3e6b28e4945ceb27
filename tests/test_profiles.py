"""The Hypothesis configuration every profile shares: the Pareto front is skipped, targeting still works, and no
profile traces its shrinks to explain a failure."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import Phase, given, seed, settings, target
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.internal.conjecture import pareto

from gqa_decode_fuzz.runner import profiles

GOAL = 123_456_789


def _always_on_the_front(self: object, data: object) -> bool:
    return True  # stands in for Hypothesis's own front, which takes nearly every example of such a run


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch) -> None:
    """A front that saves every targeted example, as Hypothesis's own nearly does, restored afterwards."""
    monkeypatch.delenv(profiles.PARETO_FRONT_ENV, raising=False)
    monkeypatch.setattr(pareto.ParetoFront, "add", _always_on_the_front)


def _closest_approach(database: InMemoryExampleDatabase, phases: tuple[Phase, ...], seed_value: int) -> int:
    """Run a passing property that targets closeness to GOAL; return how close its best example came."""
    distances = []

    @settings(max_examples=300, database=database, deadline=None, phases=phases)  # over seed's database=None
    @seed(seed_value)
    @given(st.integers(0, 10**9))
    def approach(x: int) -> None:
        distances.append(abs(x - GOAL))
        target(-distances[-1], label="closeness")

    approach()
    return min(distances)


def test_targeted_examples_are_never_saved_as_a_pareto_front(front):
    profiles.skip_pareto_front()
    database = InMemoryExampleDatabase()
    _closest_approach(database, (Phase.generate, Phase.target), seed_value=0)
    assert not database.data, f"saved under {[key[-12:] for key in database.data]}"


def test_keep_leaves_the_front_to_hypothesis(front, monkeypatch):
    monkeypatch.setenv(profiles.PARETO_FRONT_ENV, "keep")
    profiles.skip_pareto_front()
    database = InMemoryExampleDatabase()
    _closest_approach(database, (Phase.generate, Phase.target), seed_value=0)
    assert [key.endswith(b".pareto") for key in database.data] == [True]


def test_the_target_phase_still_climbs_without_the_front(front):
    profiles.skip_pareto_front()
    seeds = range(5)
    targeted = [_closest_approach(InMemoryExampleDatabase(), (Phase.generate, Phase.target), s) for s in seeds]
    generated = [_closest_approach(InMemoryExampleDatabase(), (Phase.generate,), s) for s in seeds]
    assert statistics.median(targeted) * 100 < statistics.median(generated), (targeted, generated)


@pytest.mark.parametrize("name", ["dev", "ci", "gpu", "nightly"])
def test_no_profile_runs_the_explain_phase_but_each_still_shrinks(name):
    profiles.register_profiles()
    phases = settings.get_profile(name).phases
    assert Phase.explain not in phases
    assert {Phase.generate, Phase.target, Phase.shrink} <= set(phases)
