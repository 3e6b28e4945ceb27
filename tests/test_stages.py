"""Where an example's time goes: the stage clock, the example counter and the run report's breakdown."""

import time

import pytest
from hypothesis import assume, given, settings, target
from hypothesis import strategies as st

from gqa_decode_fuzz.generation import stages
from gqa_decode_fuzz.record import run_report


@pytest.fixture
def clock():
    clock = stages.StageClock(every=1)
    stages.install(clock)
    yield clock
    stages.uninstall()


def test_stages_add_up_and_a_nested_stage_counts_toward_the_outer_one(clock):
    clock.begin_example()
    with stages.stage("oracle"):
        time.sleep(0.02)
        with stages.stage("checks"):  # e.g. a comparison inside a helper timed as a whole
            time.sleep(0.01)
    timed = stages.timed("kernel", lambda x: time.sleep(x) or "result")
    assert timed(0.01) == "result"
    taken = clock.take()
    assert taken["sampled"] == 1 and taken["checks"] == 0.0
    assert taken["oracle"] >= 0.03 and 0.01 <= taken["kernel"] < taken["oracle"]
    assert clock.take() == {"sampled": 0, **dict.fromkeys(stages.STAGES, 0.0)}  # take resets


def test_a_failing_stage_is_timed_and_the_device_is_not_synchronised_after_it():
    synchronised = []
    clock = stages.StageClock(every=1, synchronize=lambda: synchronised.append(1))
    clock.begin_example()
    with pytest.raises(RuntimeError), clock.stage("kernel"):
        raise RuntimeError("a device fault: synchronising again would raise it a second time")
    assert synchronised == [1] and clock.take()["kernel"] > 0


def test_one_example_in_every_is_sampled_at_random():
    clock = stages.StageClock(every=8)
    picks = []
    for _ in range(8000):
        clock.begin_example()
        picks.append(clock.sampling)
    assert 850 < sum(picks) < 1150
    assert picks[:8] != [True] + [False] * 7 or picks[8:16] != [True] + [False] * 7  # not a fixed stride
    with pytest.raises(ValueError, match="every=0"):
        stages.StageClock(every=0)


def test_nothing_is_timed_without_a_clock():
    stages.uninstall()
    with stages.stage("build"):
        pass  # a no-op context: the suite imported as a library pays nothing


def test_the_counter_counts_examples_failures_and_targets_but_not_rejections():
    counter = run_report.ItemCounter(stages.StageClock(every=1))
    counter.begin("properties/test_x.py::test_x")

    seen = []

    @settings(max_examples=30, database=None, derandomize=True)
    @given(st.integers(0, 100))
    def test_x(n):
        seen.append(n)
        assume(n % 3 != 0)
        target(n / 100, label="worst err/bound")
        assert n < 90

    test_x.hypothesis.inner_test = counter.counting(test_x.hypothesis.inner_test)
    with pytest.raises(AssertionError):
        test_x()
    tally = counter.tally
    assert tally.failed_examples >= 1 and tally.examples > tally.failed_examples
    assert tally.worst is not None and 0.0 <= tally.worst < 0.9  # passing examples only
    assert tally.examples == sum(n % 3 != 0 for n in seen) < len(seen)  # rejected examples are not counted
    assert counter.clock.take()["sampled"] >= tally.examples  # every run of the body began an example


def test_breakdown_per_example_with_generation_the_rest():
    lines = [
        {"examples": 10, "seconds": 1.0, "stages": {"sampled": 2, "build": 0.002, "kernel": 0.004, "oracle": 0.01,
                                                    "checks": 0.004}},
        {"examples": 30, "seconds": 1.0, "stages": {"sampled": 2, "build": 0.002, "kernel": 0.004, "oracle": 0.01,
                                                    "checks": 0.004}},
        {"examples": 0, "seconds": 0.1},  # a skipped item: no stages
    ]
    breakdown = run_report.stage_breakdown(lines)
    assert breakdown["total"] == pytest.approx(1e3 * 2.1 / 40)
    assert breakdown["oracle"] == pytest.approx(5.0) and breakdown["build"] == pytest.approx(1.0)
    assert breakdown["generation"] == pytest.approx(breakdown["total"] - 1.0 - 2.0 - 5.0 - 2.0)
    assert run_report.stage_breakdown([{"examples": 3, "seconds": 1.0}]) is None
