"""Under MPS a crash counts only if its case faults again when replayed alone (record/mps.py).

No GPU needed: ``CUDA_MPS_PIPE_DIRECTORY`` names a folder holding a plain ``control`` file, which is
all the detection looks at, and the runs are on CPU (``--device=cpu``), so no process tries to
reach an MPS server. tests/impls/mps_neighbour_fault.py crashes one property the way another
process's fault does under MPS (not on replay) and another the way a faulting kernel does.
"""

import json

import pytest

from gqa_decode_fuzz.engine import devices
from gqa_decode_fuzz.generation.cases import DecodeCase
from gqa_decode_fuzz.record import mps, run_report
from tests.pytest_runs import clean_environment, run_pytest

NEIGHBOUR = "tests/mps_cases.py::test_hit_by_a_neighbours_fault"
KERNEL = "tests/mps_cases.py::test_kernel_faults"


def _mps_directory(tmp_path):
    directory = tmp_path / "nvidia-mps"
    directory.mkdir()
    (directory / "control").touch()  # a FIFO on a real server; the detection only asks whether it exists
    return directory


def test_mps_is_detected_by_its_control_pipe(tmp_path, monkeypatch):
    directory = _mps_directory(tmp_path)
    assert devices.mps_control_pipe({devices.MPS_PIPE_ENV: str(directory)}) == directory / "control"
    assert devices.mps_control_pipe({devices.MPS_PIPE_ENV: str(tmp_path)}) is None  # a folder without the pipe
    assert devices.mps_control_pipe({devices.MPS_PIPE_ENV: str(tmp_path / "missing")}) is None
    monkeypatch.setattr(devices, "DEFAULT_MPS_PIPE_DIRECTORY", str(directory))  # the driver's default when unset
    assert devices.mps_control_pipe({}) == directory / "control"
    assert devices.mps_control_pipe({devices.MPS_PIPE_ENV: ""}) == directory / "control"
    monkeypatch.setenv(devices.MPS_PIPE_ENV, str(tmp_path))
    assert devices.mps_control_pipe() is None  # this process's environment by default


def test_a_crash_that_passes_alone_is_an_error_and_one_that_faults_again_stays_crashed(tmp_path):
    directory = _mps_directory(tmp_path)
    env = clean_environment(GQA_DECODE_ISOLATION="off", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR=str(tmp_path / "reports"), CUDA_MPS_PIPE_DIRECTORY=str(directory))
    result = run_pytest("tests/mps_cases.py", "--impl=tests/impls/mps_neighbour_fault.py:run", "--device=cpu",
                        "--hypothesis-profile=ci", "-n", "2", "--shards=1", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output  # a kernel crash happened: the run fails
    assert mps.header_line(directory / "control") in result.stdout, output
    assert f"ERROR (not a crash of this property): {NEIGHBOUR}\n    {mps.COLLATERAL}" in result.stdout, output
    assert f"CRASHED: {KERNEL}\n    reproduced: faulted again when replayed alone (outside MPS)" in result.stdout, \
        output

    (report_dir,) = (tmp_path / "reports").iterdir()
    merged = json.loads((report_dir / "report.json").read_text())
    assert merged[NEIGHBOUR]["verdict"] == "error" and merged[NEIGHBOUR]["error"] == mps.COLLATERAL
    assert merged[NEIGHBOUR]["case_file"]  # kept: it can still be replayed by hand
    assert merged[KERNEL]["verdict"] == "crashed"
    report = (report_dir / "report.md").read_text()
    assert "**FAILED: 1 of 2 properties crashed, 1 without a verdict (error)**" in report
    assert f"MPS server at {directory / 'control'}: one process's GPU fault reaches every process on its GPU; " \
           "of 2 crash(es) replayed alone, 1 faulted again (crashed), 1 did not (error)" in report
    assert f"- `{NEIGHBOUR}`: {mps.COLLATERAL}" in report


@pytest.mark.parametrize("under_mps", [True, False], ids=["mps", "no-mps"])
def test_without_xdist_the_crash_that_stopped_the_session_is_replayed_under_mps_only(tmp_path, under_mps):
    directory = _mps_directory(tmp_path) if under_mps else tmp_path  # tmp_path: no control pipe there
    env = clean_environment(GQA_DECODE_ISOLATION="off", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR="none",
                            CUDA_MPS_PIPE_DIRECTORY=str(directory))
    result = run_pytest("tests/mps_cases.py", "--impl=tests/impls/mps_neighbour_fault.py:run", "--device=cpu",
                        "--hypothesis-profile=ci", "-n", "0", env=env)
    assert result.returncode == 2, result.stdout + result.stderr  # the session stops after the crash, either way
    replayed = f"ERROR (not a crash of this property): {NEIGHBOUR}\n    {mps.COLLATERAL}"
    assert (replayed in result.stdout) is under_mps, result.stdout
    assert ("MPS server at" in result.stdout) is under_mps, result.stdout


# ---- the run report's side, without a pytest run --------------------------------------------


def _line(directory, nodeid, outcome, case_file=None):
    counter = run_report.ItemCounter()
    counter.begin(nodeid)
    counter.tally.add_case(DecodeCase(lengths=(3,)), 8)
    counter.flush(directory, "gw0", 1.0, outcome=outcome, tier="correct", case_file=case_file,
                  error="RuntimeError: CUDA error: an illegal memory access was encountered")


def _replay(nodeid, status):
    return mps.Replay(nodeid, f"/failures/{nodeid[-1]}.pt", status, "detail", 2.0)


def test_stopped_shards_of_a_collateral_crash_are_errors_but_a_real_failure_still_fails(tmp_path):
    prop, other = "p.py::test_a", "p.py::test_b"
    for name in (prop, other):
        _line(tmp_path, f"{name}[shard1of3]", "crashed", case_file=f"/failures/{name[-1]}.pt")
        _line(tmp_path, f"{name}[shard2of3]", "stopped")
    _line(tmp_path, f"{other}[shard3of3]", "failed")  # a real failure beside the collateral crash
    mps.save(tmp_path, tmp_path / "control", [_replay(f"{prop}[shard1of3]", mps.DID_NOT_REPRODUCE),
                                              _replay(f"{other}[shard1of3]", mps.DID_NOT_REPRODUCE)])
    merged = run_report.merge(tmp_path)
    assert merged[prop]["verdict"] == "error" and merged[prop]["error"] == mps.COLLATERAL
    assert merged[other]["verdict"] == "failed"
    mps.save(tmp_path, tmp_path / "control", [_replay(f"{prop}[shard1of3]", mps.UNCONFIRMED)])
    assert run_report.merge(tmp_path)[prop]["verdict"] == "crashed"  # a replay that cannot tell changes nothing


def test_summary_png_carries_the_mps_line_apart_from_title_and_panels(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _line(tmp_path, "p.py::test_a", "crashed", case_file="/failures/a.pt")
    mps.save(tmp_path, tmp_path / "control", [_replay("p.py::test_a", mps.REPRODUCED)])
    saved = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: (saved.append(figure),
                                                                              real_savefig(figure, *args, **kwargs)))
    run_report.write_report(tmp_path, "run")
    (figure,) = saved
    renderer = FigureCanvasAgg(figure).get_renderer()  # closed after saving: a canvas of its own
    (note,) = [text for text in figure.texts if text.get_text().startswith("MPS server at")]
    box = note.get_window_extent(renderer)
    assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1
    assert not box.overlaps(figure._suptitle.get_window_extent(renderer))
    assert not any(box.overlaps(axis.get_tightbbox(renderer)) for axis in figure.axes)
    assert "1 faulted again (crashed), 0 did not (error)" in note.get_text()


def test_replays_are_bounded_and_need_a_case_file(tmp_path):
    crashes = {"p.py::test_none": None, "p.py::test_over": str(tmp_path / "over.pt")}
    replays = mps.replay_crashes(crashes, device="cpu", root=tmp_path, limit=0)
    assert [(r.nodeid, r.status) for r in replays] == [("p.py::test_none", mps.UNCONFIRMED),
                                                       ("p.py::test_over", mps.UNCONFIRMED)]
    assert replays[0].detail == "no case file to replay" and "at most 0" in replays[1].detail
    (late,) = mps.replay_crashes({"p.py::test_late": str(tmp_path / "late.pt")}, device="cpu", root=tmp_path,
                                 budget=0)
    assert late.status == mps.UNCONFIRMED and "had 0 s in all" in late.detail
    with pytest.raises(ValueError, match="lanes"):
        mps.replay_crashes(crashes, device="cpu", root=tmp_path, lanes=[])


@pytest.mark.parametrize(("inside_mps", "sanitize", "joins"), [
    (False, None, False),  # the default: the child's fault stays its own
    (True, None, True),  # --mps=all: beside the workers in the server
    (True, "memcheck", False),  # a sanitized child keeps a context of its own
])
def test_an_isolated_child_joins_the_server_only_when_asked(tmp_path, monkeypatch, inside_mps, sanitize, joins):
    from gqa_decode_fuzz.engine import child_start

    monkeypatch.setenv(devices.MPS_PIPE_ENV, str(_mps_directory(tmp_path)))
    monkeypatch.setattr(child_start, "_shared_compute_mode", lambda: True)
    launch = child_start.Launch("tests/impls/torch_float32.py:run", tmp_path, "cuda", sanitize=sanitize,
                                inside_mps=inside_mps)
    env = child_start._outside_mps(launch, tmp_path)
    assert (env == {}) == joins  # an empty change: the child inherits its parent's pipe
    if not joins:
        assert devices.mps_control_pipe(env) is None  # a folder with no pipe: a context of its own


def test_the_header_says_when_the_children_run_inside_the_server(tmp_path):
    from gqa_decode_fuzz.runner.plugin import CHILDREN_INSIDE_MPS

    env = clean_environment(CUDA_MPS_PIPE_DIRECTORY=str(_mps_directory(tmp_path)), GQA_DECODE_REPORT_DIR="none")
    for mode, said in (("all", True), ("auto", False)):
        result = run_pytest("properties/test_decode.py", "--impl=tests/impls/torch_float32.py:run", "--device=cpu",
                            f"--mps={mode}", "--collect-only", "-p", "no:xdist", env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert (CHILDREN_INSIDE_MPS in result.stdout) == said, result.stdout
