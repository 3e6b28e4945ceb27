"""Where an example's time goes: the stage clock, the example counter and the run report's breakdown."""


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


class FakeTime:
    """A clock the test advances by hand: the columns come out exact."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def advance(self, ms):
        self.t += ms / 1e3


def test_the_columns_are_disjoint_and_cover_the_whole_example():
    fake = FakeTime()
    clock = stages.StageClock(every=1, now=fake)
    stages.install(clock)
    try:
        clock.begin_item("p.py::test_p")
        fake.advance(3)  # Hypothesis drawing the first example
        body = clock.timing(lambda: _an_example(fake))
        assert body() == "result"
        fake.advance(7)  # drawing the second
        body()
    finally:
        stages.uninstall()
    taken = clock.take()
    assert taken["columns"] == ["generation", "build", "kernel", "oracle", "checks", "other"]
    # generation, build, kernel, oracle (its nested checks count toward it), checks, other (the glue between)
    assert taken["first"] == [[3.0, 2.0, 0.0, 30.0, 0.0, 1.0]]
    assert taken["examples"] == [[7.0, 2.0, 0.0, 30.0, 0.0, 1.0]]
    assert sum(taken["examples"][0]) == 40.0  # the time from the end of the first example to the end of this one


def _an_example(fake):
    fake.advance(0.5)  # the body's glue: "other"
    with stages.stage("build"):
        fake.advance(2)
    with stages.stage("oracle"):
        fake.advance(20)
        with stages.stage("checks"):  # e.g. a comparison inside a helper timed as a whole
            fake.advance(10)
    fake.advance(0.5)
    return "result"


def test_generation_is_hypothesis_drawing_the_example_outside_the_body():
    fake = FakeTime()
    clock = stages.StageClock(every=1, now=fake)

    def slow_draw(n):
        fake.advance(5)  # a strategy that takes 5 ms to draw
        return n

    @settings(max_examples=20, database=None, derandomize=True)
    @given(st.integers(0, 10**6).map(slow_draw))
    def test_y(n):
        fake.advance(1)

    test_y.hypothesis.inner_test = clock.timing(test_y.hypothesis.inner_test)
    clock.begin_item("p.py::test_y")
    test_y()
    rows = clock.take()["examples"]
    assert len(rows) >= 10
    summary = stages.summarise(rows)
    assert summary["generation"]["median"] >= 5.0 and summary["other"]["median"] == pytest.approx(1.0)
    assert summary["generation"]["share"] > 0.8


def test_each_propertys_first_example_in_a_process_is_kept_apart():
    clock = stages.StageClock(every=10**9)  # no steady example sampled
    for nodeid in ("p.py::test_a[shard1of2]", "p.py::test_a[shard2of2]", "p.py::test_b"):
        clock.begin_item(nodeid.split("[")[0])
        for _ in range(3):
            clock.timing(lambda: None)()
        taken = clock.take()
        assert len(taken["first"]) == (0 if nodeid.endswith("shard2of2]") else 1) and taken["examples"] == []


def test_every_unsampled_example_is_split_into_generation_and_the_rest_without_synchronising():
    fake = FakeTime()
    synchronised = []
    clock = stages.StageClock(every=10**9, synchronize=lambda: synchronised.append(1), now=fake)
    clock.begin_item("p.py::test_p")
    fake.advance(3)
    body = clock.timing(lambda: _an_example(fake))
    body()  # the property's first example: sampled, kept apart
    synchronised.clear()
    for draw_ms in (4, 6):
        fake.advance(draw_ms)
        body()
    taken = clock.take()
    assert synchronised == [] and taken["examples"] == [] and len(taken["first"]) == 1
    assert taken["split"] == ["generation", "example"] and taken["unsampled"] == [[4.0, 33.0], [6.0, 33.0]]
    assert taken["unsampled_sums"] == [2, 10.0, 66.0]
    split = stages.summarise_split(taken["unsampled"], taken["unsampled_sums"])
    assert split["generation"]["share"] == pytest.approx(10 / 76) and split["example"]["median"] == 33.0
    assert "13.2% of their time" in stages.split_line(split)


def test_the_split_keeps_exact_sums_and_a_uniform_sample_of_rows(monkeypatch):
    monkeypatch.setattr(stages, "SPLIT_KEPT", 50)
    fake = FakeTime()
    clock = stages.StageClock(every=10**9, now=fake)
    clock.begin_item(None)  # no property: no first example kept apart
    for n in range(1000):
        fake.advance(1)  # generation 1 ms
        clock.begin_example()
        fake.advance(n % 10)  # the example: 0 to 9 ms
        clock.end_example()
    taken = clock.take()
    assert len(taken["unsampled"]) == 50 and taken["unsampled_sums"] == [1000, 1000.0, 4500.0]
    assert 2.0 < stages.quantile([row[1] for row in taken["unsampled"]], 0.5) < 7.0  # drawn from every example
    split = stages.summarise_split(taken["unsampled"], taken["unsampled_sums"])
    assert split["generation"]["share"] == pytest.approx(1000 / 5500) and split["example"]["mean"] == 4.5
    assert split["total"]["kept"] == 50 and split["generation"]["count"] == 1000
    assert clock.take()["unsampled_sums"] == [0, 0.0, 0.0]


def test_summaries_give_medians_tails_and_shares_that_add_up():
    rows = [[1.0, 2.0, 3.0, 4.0, 0.0, 0.0], [3.0, 2.0, 1.0, 4.0, 0.0, 10.0], [2.0, 2.0, 2.0, 4.0, 0.0, 0.0]]
    summary = stages.summarise(rows)
    assert summary["generation"] == {"count": 3, "median": 2.0, "p90": pytest.approx(2.8), "mean": 2.0,
                                     "share": pytest.approx(6 / 40)}
    assert sum(summary[name]["share"] for name in stages.COLUMNS) == pytest.approx(1.0)
    assert summary["total"]["median"] == 10.0 and summary["total"]["p90"] == pytest.approx(18.0)
    assert stages.summarise([]) is None
    assert stages.quantile([5.0], 0.9) == 5.0
    with pytest.raises(ValueError, match="q=2"):
        stages.quantile([1.0], 2)


def test_a_failing_stage_is_timed_and_the_device_is_not_synchronised_after_it():
    synchronised = []
    clock = stages.StageClock(every=1, synchronize=lambda: synchronised.append(1))
    clock.begin_example()
    synchronised.clear()
    with pytest.raises(RuntimeError), clock.stage("kernel"):
        raise RuntimeError("a device fault: synchronising again would raise it a second time")
    clock.end_example()
    (row,) = clock.take()["examples"]
    assert synchronised == [1] and row[stages.COLUMNS.index("kernel")] > 0
    clock.begin_example()
    with pytest.raises(ValueError, match="name='compile'"), clock.stage("compile"):
        pass


def test_one_example_in_every_is_sampled_at_random():
    clock = stages.StageClock(every=8)
    picks = []
    for _ in range(8000):
        clock.begin_example()
        picks.append(clock.sampling)
        clock.end_example()
    assert 850 < sum(picks) < 1150 and len(clock.take()["examples"]) == sum(picks)
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

    test_x.hypothesis.inner_test = counter.clock.timing(counter.counting(test_x.hypothesis.inner_test))
    with pytest.raises(AssertionError):
        test_x()
    tally = counter.tally
    assert tally.failed_examples >= 1 and tally.examples > tally.failed_examples
    assert tally.worst is not None and 0.0 <= tally.worst < 0.9  # passing examples only
    assert tally.examples == sum(n % 3 != 0 for n in seen) < len(seen)  # rejected examples are not counted
    taken = counter.clock.take()
    assert len(taken["first"]) == 1 and len(taken["first"] + taken["examples"]) == len(seen)  # every run is timed


def test_breakdown_takes_medians_over_every_items_rows_with_first_examples_apart():
    columns = list(stages.COLUMNS)
    lines = [
        {"examples": 10, "seconds": 1.0, "stages": {"columns": columns, "first": [[50.0, 1, 900.0, 1, 1, 1]],
                                                    "examples": [[1.0, 1, 2.0, 1, 1, 0], [1.0, 1, 2.0, 1, 1, 0]]}},
        {"examples": 30, "seconds": 1.0, "stages": {"columns": columns[::-1], "first": [],  # any column order
                                                    "examples": [[2, 1, 1, 4.0, 1, 3.0]]}},
        {"examples": 0, "seconds": 0.1},  # a skipped item: no stages
        {"examples": 5, "seconds": 1.0, "stages": {"sampled": 2, "build": 0.002}},  # an old part line: no rows
    ]
    breakdown = run_report.stage_breakdown(lines)
    steady, first = breakdown["steady"], breakdown["first"]
    assert steady["total"]["count"] == 3 and first["total"]["count"] == 1
    assert steady["kernel"]["median"] == 2.0 and steady["generation"]["median"] == 1.0
    assert first["kernel"]["median"] == 900.0  # the compilation stays out of the steady medians
    assert sum(steady[name]["share"] for name in stages.COLUMNS) == pytest.approx(1.0)
    assert breakdown["busy_ms_per_example"] == pytest.approx(1e3 * 3.1 / 45)
    assert breakdown["split"] is None  # no unsampled rows in these lines
    lines[0]["stages"].update(unsampled=[[1.0, 3.0], [2.0, 6.0]], unsampled_sums=[5, 6.0, 18.0])
    lines[1]["stages"].update(unsampled=[[3.0, 9.0]], unsampled_sums=[1, 3.0, 9.0])
    split = run_report.stage_breakdown(lines)["split"]  # the sums count every example, the rows a sample
    assert split["generation"]["count"] == 6 and split["generation"]["share"] == pytest.approx(0.25)
    assert split["total"]["kept"] == 3 and split["generation"]["mean"] == pytest.approx(1.5)
    assert run_report.stage_breakdown([{"examples": 3, "seconds": 1.0}]) is None
