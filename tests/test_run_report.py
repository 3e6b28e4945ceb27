"""The run report leads with the verdict: per property, the worst outcome over its shards."""

import importlib.util
import json
import re
import time

import pytest

from gqa_decode_fuzz.generation.cases import DecodeCase
from gqa_decode_fuzz.record import run_report
from gqa_decode_fuzz.record.causes import SECONDS_PAST_A_TIME_BUDGET
from tests.pytest_runs import clean_environment, run_pytest

COUNTER = run_report.ItemCounter()

RUN = "20250101-000000-abcd"
T0 = 1_700_000_000.0
CASE = DecodeCase(lengths=(3, 0, 17))


def _item(directory, nodeid, *, worker="gw0", gpu="0", outcome="passed", examples=10, seconds=2.0, started=T0,
          case_file=None, error=None, worst=0.25, tier="correct"):
    """One test item as the plugin reports it: begin, cases and observations, flush."""
    COUNTER.begin(nodeid)
    COUNTER.tally.add_case(CASE, 64)
    for n in range(examples):
        failing = outcome in ("failed", "crashed") and n == examples - 1
        COUNTER.tally.add_observation("failed" if failing else "passed", {} if failing else {"err/bound": worst})
    COUNTER.flush(directory, worker, seconds, gpu=gpu, outcome=outcome, tier=tier, case_file=case_file,
                     error=error, started=started)


def _case_file(tmp_path, name, size):
    path = tmp_path / "failures" / f"{name}.pt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"x" * size)
    return str(path)


def _node(name, shard, shards):
    return f"properties/test_suite.py::test_{name}[shard{shard}of{shards}]"


@pytest.fixture
def run(tmp_path):
    """26 properties over two GPUs: 3 failed (one only seen as stopped shards), 1 crashed, 1 skipped."""
    directory = tmp_path / "report"
    files = {"big": _case_file(tmp_path, "big", 5000), "small": _case_file(tmp_path, "small", 300),
             "mid": _case_file(tmp_path, "mid", 900), "crash": _case_file(tmp_path, "crash", 4000),
             "tiny": _case_file(tmp_path, "tiny", 10)}
    outcomes = {  # property -> outcome per shard (and its case file)
        "output_within_bound": ["failed", "failed", "failed"] + ["passed"] * 13,
        "lse_base_two": ["failed", "failed", "stopped", "stopped"],
        "junk_pages_unchanged": ["crashed", "failed", "stopped", "stopped"],
        "only_stopped": ["stopped"] * 4,
        "huge_pools_plain": ["skipped"] * 4,
    }
    cases = {("output_within_bound", 0): "big", ("output_within_bound", 1): "small",
             ("output_within_bound", 2): "mid", ("lse_base_two", 1): "mid",
             ("junk_pages_unchanged", 0): "crash", ("junk_pages_unchanged", 1): "tiny"}
    for n in range(21):
        outcomes[f"passing_property_number_{n:02d}_with_a_rather_long_name"] = ["passed"] * 4
    for name, shards in outcomes.items():
        for shard, outcome in enumerate(shards):
            case = files[cases[name, shard]] if (name, shard) in cases else None
            _item(directory, _node(name, shard + 1, len(shards)), worker=f"gw{shard % 4}", gpu=str(shard % 2),
                  outcome=outcome, examples=0 if outcome == "skipped" else 10, seconds=2.0,
                  started=T0 + shard, case_file=case,
                  error=f"AssertionError: {name} shard {shard}\nmore detail" if outcome in ("failed", "crashed")
                  else None)
    return directory, files


def _table(report):
    return [line for line in report.read_text(encoding="utf-8").splitlines() if line.startswith("|")]


def _row(report, name):
    (row,) = [line for line in _table(report) if f"::test_{name}`" in line]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_report_leads_with_run_tier_and_verdict(run):
    directory, _ = run
    report = run_report.write_report(directory, RUN)
    assert report == directory / "report.md"
    head = [line for line in report.read_text(encoding="utf-8").splitlines() if line][:3]
    assert head == [f"# Run report {RUN}", "Tier: correct",
                    "**FAILED: 3 of 26 properties failed, 1 crashed, 1 skipped**"]


def test_verdict_table_first_failures_first(run):
    directory, _ = run
    report = run_report.write_report(directory, RUN)
    table = _table(report)
    assert table[0] == "| property | verdict | shards failing | examples | examples/s | worst err/bound | case file |"
    verdicts = [row.split("|")[2].strip() for row in table[2:28]]
    assert verdicts == ["CRASHED"] + ["FAILED"] * 3 + ["passed"] * 21 + ["skipped"]
    assert "::test_junk_pages_unchanged`" in table[2]
    # the terminal summary prints the first 22 '|' lines: the verdict table's, failures at its top
    text = report.read_text(encoding="utf-8")
    assert text.index(table[0]) < text.index("## Failures") < text.index("## `") < text.index("## Workers")


def test_shards_failing_counted_with_stopped_ones(run):
    directory, _ = run
    report = run_report.write_report(directory, RUN)
    assert _row(report, "output_within_bound")[2] == "3 of 16"
    assert _row(report, "lse_base_two")[2] == "2 of 4 (2 stopped)"
    assert _row(report, "junk_pages_unchanged")[1:3] == ["CRASHED", "2 of 4 (2 stopped)"]
    # a shard stops only because a sibling failed: the property failed even without that sibling's line
    assert _row(report, "only_stopped")[1:3] == ["FAILED", "0 of 4 (4 stopped)"]
    assert _row(report, "huge_pools_plain")[1:3] == ["skipped", "0 of 4"]


def test_one_case_file_per_property(run):
    directory, files = run
    report = run_report.write_report(directory, RUN)
    assert _row(report, "output_within_bound")[6] == f"`{files['small']}`"  # the smallest counterexample
    assert _row(report, "lse_base_two")[6] == f"`{files['mid']}`"
    assert _row(report, "junk_pages_unchanged")[6] == f"`{files['crash']}`"  # the crash, not a smaller failure
    assert _row(report, "only_stopped")[6] == "-"
    for row in _table(report)[2:]:
        if "passing_property" in row:
            assert row.rstrip(" |").endswith("-")
    merged = json.loads((directory / "report.json").read_text())
    chosen = merged[_node("output_within_bound", 1, 16).rpartition("[")[0]]
    assert chosen["case_file"] == files["small"] and chosen["error"] == "AssertionError: output_within_bound shard 1"


def test_examples_per_second_per_property_and_per_gpu(run):
    directory, _ = run
    report = run_report.write_report(directory, RUN)
    row = _row(report, "output_within_bound")
    assert row[3:6] == ["160", "5.0", "0.25"]  # 16 shards x 10 examples over 16 x 2 s
    summary = json.loads((directory / "run.json").read_text())
    # 112 items of 10 examples (4 skipped ones ran none); on each GPU items start at T0 + 0..15 and run 2 s
    assert summary["throughput"]["examples"] == 1120 and summary["throughput"]["wall"] == pytest.approx(17.0)
    assert summary["throughput"]["examples_per_second_per_gpu"] == pytest.approx(1120 / 17.0 / 2)
    assert summary["gpus"]["0"]["wall"] == pytest.approx(16.0)  # even shards: T0 + 0 .. T0 + 14 + 2
    assert summary["gpus"]["1"]["wall"] == pytest.approx(16.0)  # odd shards: T0 + 1 .. T0 + 15 + 2
    assert summary["gpus"]["0"]["examples"] + summary["gpus"]["1"]["examples"] == 1120
    assert "1120 examples in 17.0 s wall: 65.9 examples/s, 32.9 per GPU on 2 GPUs" in report.read_text()


def test_summary_png_is_written(run):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    directory, _ = run
    run_report.write_report(directory, RUN)
    assert (directory / "summary.png").stat().st_size > 10_000


def test_passing_run_says_passed(tmp_path):
    for shard in (1, 2):
        _item(tmp_path, _node("a", shard, 2), tier="strict")
    report = run_report.write_report(tmp_path, RUN)
    text = report.read_text()
    assert "Tier: strict" in text and "**PASSED: 1 properties**" in text and "## Failures" not in text


def test_old_format_lines_still_merge(tmp_path):
    """Lines written before outcomes existed: passed only if no example failed."""
    old = {"cases": 3, "sequences": 9, "examples": 3, "worst": 0.5, "seconds": 1.5,
           "counts": {"batch": {"2-4": 3}}, "worker": "gw0", "gpu": None}
    lines = [{**old, "nodeid": "p.py::test_good[shard1of2]", "property": "p.py::test_good", "failed_examples": 0},
             {**old, "nodeid": "p.py::test_good[shard2of2]", "property": "p.py::test_good", "failed_examples": 0},
             {**old, "nodeid": "p.py::test_bad[shard1of2]", "property": "p.py::test_bad", "failed_examples": 1},
             {**old, "nodeid": "p.py::test_bad[shard2of2]", "property": "p.py::test_bad", "failed_examples": 0}]
    (tmp_path / "parts-gw0-1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    merged = run_report.merge(tmp_path)
    assert merged["p.py::test_good"]["verdict"] == "passed"
    assert merged["p.py::test_bad"]["verdict"] == "failed" and merged["p.py::test_bad"]["failing_shards"] == 1
    assert merged["p.py::test_bad"]["case_file"] is None
    report = run_report.write_report(tmp_path, RUN)
    text = report.read_text()
    assert "Tier: unknown" in text and "**FAILED: 1 of 2 properties failed**" in text
    assert _row(report, "bad")[1:5] == ["FAILED", "1 of 2", "6", "2.0"]


def test_flush_writes_outcomes_even_without_cases(tmp_path):
    COUNTER.begin("p.py::test_gpu_only")
    COUNTER.flush(tmp_path, "gw0", 0.1)  # built no case, no outcome: not a property
    assert not list(tmp_path.glob("parts-*"))
    COUNTER.flush(tmp_path, "gw0", 0.1, outcome="skipped")
    COUNTER.begin("p.py::test_x")
    before = time.time()
    COUNTER.flush(tmp_path, "gw0", 3.0, outcome="crashed", error="RuntimeError: CUDA error\ntraceback",
                     case_file=tmp_path / "c.pt")
    skipped, crashed = [json.loads(line) for line in next(tmp_path.glob("parts-*")).read_text().splitlines()]
    assert skipped["outcome"] == "skipped" and skipped["error"] is None and skipped["case_file"] is None
    assert crashed["error"] == "RuntimeError: CUDA error" and crashed["case_file"] == str(tmp_path / "c.pt")
    assert before - 3.0 - 1 <= crashed["started"] <= time.time() - 3.0
    with pytest.raises(ValueError, match="outcome"):
        COUNTER.flush(tmp_path, "gw0", 0.1, outcome="exploded")


def test_verdict_line_forms():
    def merged(*verdicts):
        return {str(n): {"verdict": v} for n, v in enumerate(verdicts)}

    assert run_report.verdict_line(merged("passed", "passed")) == "PASSED: 2 properties"
    assert run_report.verdict_line(merged("passed", "crashed")) == "FAILED: 1 of 2 properties crashed"
    assert run_report.verdict_line(merged("failed", "crashed", "skipped")) == (
        "FAILED: 1 of 3 properties failed, 1 crashed, 1 skipped")
    assert run_report.short_name("a/b.py::test_" + "x" * 50).endswith("…")
    assert run_report.short_name("a/b.py::test_lse[small]") == "lse[small]"


def test_items_a_time_budget_left_unstarted_are_counted_not_passed(tmp_path):
    """A property with one shard run and one unstarted passes on what ran, and says what did not; one whose
    shards never started is skipped, not passed."""
    _item(tmp_path, _node("ran", 1, 2))
    _item(tmp_path, _node("ran", 2, 2), outcome="unstarted", examples=0)
    for shard in (1, 2):
        _item(tmp_path, _node("never", shard, 2), outcome="unstarted", examples=0)
    report = run_report.write_report(tmp_path, RUN)
    assert "**PASSED: 1 properties, 1 skipped; 3 items not started (time budget spent)**" in report.read_text()
    assert _row(report, "ran")[1:3] == ["passed", "0 of 2 (1 not started)"]
    assert _row(report, "never")[1:3] == ["skipped", "0 of 2 (2 not started)"]


BUDGET_S = 12  # comfortably more than a loaded CI machine needs to reach the first property


def test_a_time_budget_stops_starting_tests_and_still_finds_the_causes(tmp_path):
    """A failing property, a test that outlasts the budget, then properties that find it spent: they are reported
    as not started, and the failure found before is still probed into its cause (the run is not interrupted)."""
    env = clean_environment(TIME_BUDGET_SLEEP_S=str(BUDGET_S + 1), GQA_DECODE_FAILURES_DIR=str(tmp_path / "f"),
                            GQA_DECODE_REPORT_DIR=str(tmp_path / "reports"))
    result = run_pytest("properties/test_decode.py::test_output_and_lse_within_error_bound",
                        "tests/time_budget_cases.py", "properties/test_edge_shapes.py", "-n", "0",
                        "--isolation=off", "--impl=tests/impls/wrong_kv_head.py:run", "--max-examples=5",
                        f"--time-budget={BUDGET_S}", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"time budget {BUDGET_S} s: no test starts after it" in output
    assert re.search(rf"gqa-decode: [5-9] items not started: the run's --time-budget of {BUDGET_S} s", output), output
    assert "gqa-decode: 1 distinct failure (root causes, grouped by probing)" in output, output
    (report,) = (tmp_path / "reports").glob("*/report.md")
    assert re.search(r"\*\*FAILED: 1 of \d+ properties failed, \d+ skipped; [5-9] items not started \(time budget",
                     report.read_text()), report.read_text()
    (found,) = (tmp_path / "reports").glob("*/causes.json")
    assert json.loads(found.read_text())["probes"]["seconds_limit"] == SECONDS_PAST_A_TIME_BUDGET  # the budget spent


def test_the_verdicts_are_written_before_the_probes_start(tmp_path):
    """Probing can take minutes; a run stopped during it (a CI step's limit, Ctrl-C) still leaves its report, with
    every verdict, which the probes' causes then complete. Seen on the H200: a step limit during the probes of a
    huge-pool failure left no report at all."""
    watch = tmp_path / "watch.txt"
    env = clean_environment(PROBE_WATCH_FILE=str(watch), GQA_DECODE_FAILURES_DIR=str(tmp_path / "f"),
                            GQA_DECODE_REPORT_DIR=str(tmp_path / "reports"))
    result = run_pytest("properties/test_decode.py::test_output_and_lse_within_error_bound", "-n", "0",
                        "-p", "tests.probe_watch_plugin", "--isolation=off", "--impl=tests/impls/wrong_kv_head.py:run",
                        "--max-examples=5", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "**FAILED: 1 of 1 properties failed" in watch.read_text(), watch.read_text()
    assert "distinct failure" not in watch.read_text()
    (report,) = (tmp_path / "reports").glob("*/report.md")
    assert "## 1 distinct failure" in report.read_text(), report.read_text()


@pytest.mark.parametrize("picture", ["on", "off"])
def test_report_picture_off_leaves_summary_png_out_and_the_rest_in(tmp_path, picture):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "f"), GQA_DECODE_REPORT_DIR=str(tmp_path / "r"))
    result = run_pytest("properties/test_decode.py::test_output_and_lse_within_error_bound", "-n", "0",
                        "--isolation=off", "--impl=tests/impls/wrong_kv_head.py:run", "--max-examples=5",
                        f"--report-picture={picture}", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    (directory,) = (tmp_path / "r").iterdir()
    assert {"report.md", "report.json", "run.json", "causes.json"} <= {path.name for path in directory.iterdir()}
    assert (directory / "summary.png").is_file() == (picture == "on")


def test_a_family_sized_run_draws_its_failures_first_and_lists_every_property(tmp_path, monkeypatch):
    """Over ``MAX_DRAWN`` properties (a family run has over a thousand) the strip draws the first ``MAX_DRAWN``,
    failures first, and says how many more report.md lists."""
    drawn = []
    panel = run_report._verdict_panel
    monkeypatch.setattr(run_report, "_verdict_panel", lambda axis, merged, names: (drawn.extend(names),
                                                                                     panel(axis, merged, names)))
    count = run_report.MAX_DRAWN + 7
    for n in range(count):
        _item(tmp_path, _node(f"p{n:03d}", 1, 1), outcome="failed" if n == count - 1 else "passed", examples=2)
    report = run_report.write_report(tmp_path, RUN)
    assert len(drawn) == run_report.MAX_DRAWN and drawn[0].endswith(f"p{count - 1:03d}"), drawn[:2]
    assert len([row for row in _table(report) if "::test_p" in row]) == count


def test_summary_png_layout_keeps_every_label_inside_and_apart(run, monkeypatch):
    """The explicit layout (no tight_layout): long property names, titles and tick labels all lie inside the
    figure, and no panel's labels run into a neighbouring panel."""
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    directory, _ = run
    saved = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: (saved.append(figure),
                                                                              real_savefig(figure, *args, **kwargs)))
    run_report.write_report(directory, RUN)
    (figure,) = saved
    renderer = FigureCanvasAgg(figure).get_renderer()  # closed after saving: a canvas of its own
    page = figure.bbox
    boxes = []
    for axis in figure.axes:
        labels = []
        for side in (axis.xaxis, axis.yaxis):
            low, high = sorted(side.get_view_interval())
            labels += [tick.label1 for tick in side.get_major_ticks() if low <= tick.get_loc() <= high]  # drawn
        texts = [*labels, axis.title, axis.xaxis.label]
        for text in texts:
            if text.get_text():
                box = text.get_window_extent(renderer)
                assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, \
                    text.get_text()
        boxes.append(axis.get_tightbbox(renderer))
    suptitle = figure._suptitle.get_window_extent(renderer)
    assert page.x0 <= suptitle.x0 and suptitle.x1 <= page.x1 and suptitle.y1 <= page.y1
    for n, box in enumerate(boxes):
        assert not box.overlaps(suptitle)
        for other in boxes[n + 1:]:
            assert not box.overlaps(other)
    names = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert "passing_property_number_00_with_a_r…" in names  # long names shown, truncated as before


def test_warm_up_leaves_the_report_unchanged(run):
    directory, _ = run
    first = run_report.write_report(directory, RUN).read_text(encoding="utf-8")
    run_report.warm_up()
    assert run_report.write_report(directory, RUN).read_text(encoding="utf-8") == first


def test_report_leads_with_the_root_causes(run):
    """Where the run's failures were grouped (causes.json, written before the report), report.md gives them
    right after the verdict line, before the table, and report.json's first key holds them."""
    from gqa_decode_fuzz.record import causes

    directory, files = run
    found = [causes.Cause(causes.Failure(_node("output_within_bound", 2, 16), files["small"], "AssertionError: off",
                                         case=CASE), needs=["scale <= 0"], free=["any length"],
                          members=[(causes.Failure(_node("lse_base_two", 2, 4), files["mid"], case=CASE), "probed")])]
    causes.save(directory, causes.as_json(found, causes.Prober(None, None, "correct")))
    report = run_report.write_report(directory, RUN)
    text = report.read_text(encoding="utf-8")
    head = [line for line in text.splitlines() if line][:5]
    assert head[2:] == ["**FAILED: 3 of 26 properties failed, 1 crashed, 1 skipped**", "## 1 distinct failure",
                        "1. scale <= 0, any length: 2 properties"]
    assert f"   replay: python -m gqa_decode_fuzz.record.repro {files['small']}" in text
    assert text.index("## 1 distinct failure") < text.index("| property | verdict")
    assert "   - properties/test_suite.py::test_lse_base_two" in text
    saved = json.loads((directory / "report.json").read_text())
    assert next(iter(saved)) == "causes" and saved["causes"]["causes"][0]["needs"] == ["scale <= 0"]


def test_items_whose_names_differ_past_the_cut_get_case_files_of_their_own():
    """Seen on the H200: two layout items' case files, written in one second by one process, were one file."""
    from gqa_decode_fuzz.record.casefiles import _file_name

    stem = "properties/test_layouts.py::test_strided_and_sliced_inputs_give_the_right_answer_or_a_clear_error"
    names = {_file_name(f"{stem}[shard1of8-{layout}]") for layout in ("mixed", "combined")}
    assert len(names) == 2 and len({_file_name(stem), _file_name(stem)}) == 2


def test_the_stage_table_gives_medians_and_shares_that_add_up_with_first_examples_apart(tmp_path):
    columns = ["generation", "build", "kernel", "oracle", "checks", "other"]
    steady = [[1.0, 0.5, 0.2 + n / 100, 0.7, 0.4, 0.2] for n in range(40)]
    line = {"nodeid": "p.py::test_p", "property": "p.py::test_p", "cases": 40, "sequences": 40, "examples": 40,
            "failed_examples": 0, "worst": 0.1, "seconds": 1.0, "counts": {}, "worker": "gw0", "gpu": "0",
            "outcome": "passed", "started": T0,
            "stages": {"columns": columns, "examples": steady, "first": [[80.0, 20.0, 1500.0, 5.0, 1.0, 2.0]]}}
    (tmp_path / "parts-gw0-1.jsonl").write_text(json.dumps(line) + "\n")
    text = run_report.write_report(tmp_path, RUN).read_text()
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in
                                               text.splitlines() if row.startswith("| ")) if cells[0] in
            (*columns, "total")}
    assert set(rows) == {*columns, "total"}
    assert rows["kernel"][0] == "0.395" and rows["generation"][:2] == ["1.000", "1.000"]  # the first call left out
    assert sum(float(rows[name][3].rstrip("%")) for name in columns) == pytest.approx(100.0, abs=0.2)
    assert "40 examples timed" in text and "First examples (1: compilation, loading): median 1608.0 ms" in text


def test_a_prefill_case_is_counted_by_query_length_and_the_edge_each_sequence_is():
    from gqa_decode_fuzz.generation.prefill_cases import PrefillCase

    tally = run_report.Tally()
    tally.add_case(PrefillCase(q_lens=(1, 5, 3, 6, 0, 2), kv_lens=(9, 5, 130, 3, 4, 0),
                               definition="gqa_paged_prefill_causal_h32_kv4_d128_ps1"), 64)
    assert tally.counts["prefill sequence"] == {"one query": 1, "fresh (q = kv)": 1, "q > kv": 1,
                                                "chunk after a prefix (q < kv)": 1, "no queries": 1, "no keys": 1}
    assert tally.counts["query length"] == {"0": 1, "1": 1, "2-16": 4}
    assert tally.counts["length"]["129-1024"] == 1  # "length" counts a sequence's keys
    tally.add_case(CASE, 64)  # a decode case adds to neither
    assert sum(tally.counts["prefill sequence"].values()) == 6 and sum(tally.counts["query length"].values()) == 6
