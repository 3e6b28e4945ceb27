"""Case files and their replay: ``python -m gqa_decode_fuzz.record.repro FILE``."""

import torch

from gqa_decode_fuzz.generation.cases import DecodeCase, build
from gqa_decode_fuzz.generation.prefill_cases import PrefillCase
from gqa_decode_fuzz.record import casefiles
from gqa_decode_fuzz.record.repro.diagnosis import describe_layout, describe_mismatch, ranges
from gqa_decode_fuzz.reference import attend
from tests.impls.torch_float32 import run as correct
from tests.pytest_runs import clean_environment, run_module, run_pytest

# Adds 0.5 to dims 70-79 of head 5 of sequence 1: a defect with an address.
DEFECT = (
    "from tests.impls.torch_float32 import run as correct\n"
    "def run(*args):\n"
    "    output, lse = correct(*args)\n"
    "    if output.shape[0] > 1:\n"
    "        output[1, 5, 70:80] += 0.5\n"
    "    return output, lse\n"
)
CASE = DecodeCase(lengths=(3, 40, 0), page_layout="shared_prefix", spare_pages=5, seed=7)


def _defective(tmp_path) -> str:
    (tmp_path / "defect.py").write_text(DEFECT)
    return f"{tmp_path / 'defect.py'}:run"


def test_ranges_read_as_runs():
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert ranges([]) == "none"


def test_diagnosis_names_sequence_heads_and_dims():
    inputs = build(CASE)
    output, lse = correct(*inputs.arguments())
    output[1, 5, 70:80] += 0.5
    lines, failed = describe_mismatch(output, lse, attend(*inputs), list(CASE.lengths), 8)
    text = "\n".join(lines)
    assert failed
    assert "seq 1 (40 tokens)" in text and "heads 5;" in text and "dims 70-79" in text, text
    assert "sequences within bound: 0, 2" in text


def test_diagnosis_of_a_correct_result_finds_nothing():
    inputs = build(CASE)
    lines, failed = describe_mismatch(*correct(*inputs.arguments()), attend(*inputs), list(CASE.lengths), 8)
    assert not failed and "0 of 12288 elements outside the bound" in lines[0]


def test_layout_in_words_names_sharing_strides_and_empties():
    inputs = build(CASE)
    strided_q = torch.zeros(3, 32, 256, dtype=torch.bfloat16)[:, :, ::2]
    strided_q.copy_(inputs.q)
    text = "\n".join(describe_layout(*inputs._replace(q=strided_q)))
    assert "lengths 3, 40, 0 (1 empty)" in text
    assert "shared between sequences (0, 1)" in text
    assert "q: [3, 32, 128] bfloat16, strides [8192, 256, 2]" in text and "NOT contiguous" in text


def test_case_file_keeps_values_strides_and_gaps(tmp_path):
    inputs = build(CASE)
    padded = torch.full((3, 32, 130), float("nan"), dtype=torch.bfloat16)
    q = padded[:, :, 1:129]
    q.copy_(inputs.q)
    record = casefiles.Recorder()
    record.begin("tests/x.py::test_x")
    record.note_build(CASE)
    record.note_call((q, *inputs[1:]), {})
    path = casefiles.save_case(tmp_path, record, error="AssertionError: boom", impl_spec="kernel:run",
                               device=torch.device("cpu"), profile="ci", run_id="r1")
    saved = casefiles.load_case(path)
    (args, kwargs), = [casefiles.restore_call(call, "cpu") for call in saved["calls"]]
    assert args[0].stride() == q.stride() and args[0].storage_offset() == 1
    assert torch.equal(args[0], q) and torch.isnan(args[0].as_strided((1,), (1,), 0)).all()
    assert saved["case_repr"] == repr(CASE) and saved["nodeid"] == "tests/x.py::test_x"
    assert set(saved["versions"]) == {"python", "torch", "triton", "hypothesis"}
    assert casefiles.runs_index(tmp_path, "r1")[0]["path"] == str(path)


def test_case_file_after_a_fault_is_rebuilt_from_the_case(tmp_path):
    record = casefiles.Recorder()
    record.begin("tests/x.py::test_x")
    inputs = build(CASE)  # alive while the case file is written, as in a failing test's traceback
    record.note_build(CASE, inputs)
    path = casefiles.save_case(tmp_path, record, error="RuntimeError: illegal memory access", impl_spec="kernel:run",
                               device=torch.device("cpu"), profile="ci", run_id="r1", device_readable=False)
    saved = casefiles.load_case(path)
    built_args = [{"built": name} for name in build(CASE)._fields[:5]] + [CASE.scale, None]
    assert saved["calls"] == [{"args": built_args, "kwargs": {}}]  # no tensor in the file: all rebuilt
    case = casefiles.case_from_fields(saved["case_fields"])
    (args, _), = [casefiles.restore_call(call, "cpu", case) for call in saved["calls"]]
    for restored, built in zip(args[:5], build(CASE)[:5]):
        torch.testing.assert_close(restored, built, rtol=0, atol=0, equal_nan=True)


def test_failing_property_saves_a_case_that_replays_on_cpu(tmp_path):
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("properties/test_decode.py::test_output_and_lse_within_error_bound", "-n", "0", "-x",
                        "--hypothesis-profile=ci", f"--impl={_defective(tmp_path)}", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gqa-decode case file" in result.stdout and "python -m gqa_decode_fuzz.record.repro" in result.stdout
    (path,) = (tmp_path / "failures").glob("*.pt")
    saved = casefiles.load_case(path)
    assert saved["case_repr"].startswith("DecodeCase(lengths=(")
    assert "@reproduce_failure" in saved["error"] + saved["hypothesis_output"]

    replay = run_module("gqa_decode_fuzz.record.repro", str(path), "--device", "cpu", env=env)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "seq 1 (" in replay.stdout and "heads 5;" in replay.stdout and "dims 70-79" in replay.stdout
    assert "reproduced on cpu" in replay.stdout
    assert path.with_suffix(".png").stat().st_size > 0

    fixed = run_module("gqa_decode_fuzz.record.repro", str(path), "--device", "cpu", "--no-png",
                       "--impl", "tests/impls/torch_float32.py:run", env=env)
    assert fixed.returncode == 0 and "did not reproduce" in fixed.stdout, fixed.stdout + fixed.stderr


def test_repro_rejects_a_file_that_is_no_case_file(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"junk")
    result = run_module("gqa_decode_fuzz.record.repro", str(tmp_path / "junk.pt"))
    assert result.returncode == 2 and "not a case file" in result.stderr


def test_small_arguments_are_copied_at_the_call_and_survive_a_fault(tmp_path):
    inputs = build(CASE)
    broken = inputs.kv_indptr.clone()
    broken[1] = 99  # a corrupted argument the kernel faulted on: no built tensor, unreadable after the fault
    record = casefiles.Recorder()
    record.begin("tests/x.py::test_x")
    record.note_build(CASE, inputs)
    record.note_call((inputs.q, inputs.k_cache, inputs.v_cache, broken, inputs.kv_indices, torch.ones(2).numpy()), {})
    path = casefiles.save_case(tmp_path, record, error="RuntimeError: illegal memory access", impl_spec="kernel:run",
                               device=torch.device("cpu"), profile="ci", run_id="r1", device_readable=False)
    (call,) = casefiles.load_case(path)["calls"]  # loads with weights_only: nothing but tensors and plain data
    assert call["args"][0] == {"built": "q"} and "omitted" in call["args"][5]
    restored = casefiles.restore_call({"args": call["args"][:5], "kwargs": {}}, "cpu", CASE)[0]
    assert torch.equal(restored[3], broken)
    torch.testing.assert_close(restored[1], inputs.k_cache, rtol=0, atol=0, equal_nan=True)
    assert path.stat().st_size < 64 * 1024


def test_replay_exit_status_says_reproduced_only_when_it_did(tmp_path):
    """1 when the case faults again, also where the sticky error surfaces after the call (as a GPU's does);
    3, not 0, when a call could not be rebuilt: crash replays under MPS (record/mps.py) read 0
    as "passed alone"."""
    record = casefiles.Recorder()
    record.begin("tests/x.py::test_x")
    inputs = build(CASE)
    record.note_build(CASE, inputs)
    record.note_call(tuple(inputs[:5]), {})
    path = casefiles.save_case(tmp_path, record, error="RuntimeError: illegal memory access", impl_spec="kernel:run",
                               device=torch.device("cpu"), profile="ci", run_id="r1", device_readable=False)
    replay = run_module("gqa_decode_fuzz.record.repro", str(path), "--device", "cpu", "--no-png", "--isolation", "off",
                        "--impl", "tests/impls/asynchronous_cuda_fault.py:run")  # in-process: its fault is ours
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "reproduced on cpu: a sticky CUDA error" in replay.stdout and "Traceback" not in replay.stderr

    record.note_call((*inputs[:4], torch.zeros(2**21, dtype=torch.int32)), {})  # too big to copy, then unreadable
    partial = casefiles.save_case(tmp_path, record, error="RuntimeError: illegal memory access",
                                  impl_spec="tests/impls/torch_float32.py:run", device=torch.device("cpu"),
                                  profile="ci", run_id="r1", device_readable=False)
    replay = run_module("gqa_decode_fuzz.record.repro", str(partial), "--device", "cpu", "--no-png")
    assert replay.returncode == 3 and "not replayed in full" in replay.stdout, replay.stdout + replay.stderr


def test_a_kernel_replayed_in_its_own_process_cannot_talk_the_replay_into_green(tmp_path):
    """hostile_replaces_comparison loosens the oracle's bounds at import: trusted in-process it turns its own
    failure into "did not reproduce"; replayed as the suite runs it (isolated, the default), it reproduces."""
    record = casefiles.Recorder()
    record.begin("properties/test_decode.py::test_output_and_lse_within_error_bound")
    inputs = build(DecodeCase(lengths=(3, 5)))
    record.note_build(DecodeCase(lengths=(3, 5)), inputs)
    record.note_call(tuple(inputs[:5]), {})
    hostile = "tests/impls/hostile_replaces_comparison.py:run"
    path = casefiles.save_case(tmp_path, record, error="AssertionError: off", impl_spec=hostile,
                               device=torch.device("cpu"), profile="ci", run_id="r1")
    isolated = run_module("gqa_decode_fuzz.record.repro", str(path), "--device", "cpu", "--no-png")
    assert isolated.returncode == 1 and "isolation: on" in isolated.stdout, isolated.stdout + isolated.stderr
    trusted = run_module("gqa_decode_fuzz.record.repro", str(path), "--device", "cpu", "--no-png", "--isolation", "off")
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr  # the threat is real


# Zeroes the output rows 2.. of a causal prefill call (of the ragged definition below).
PREFILL_DEFECT = (
    "from gqa_decode_fuzz.kernel import run as ours\n"
    "from gqa_decode_fuzz.reference import definitions\n"
    "_run = ours.for_definition(definitions.by_name('gqa_ragged_prefill_causal_h32_kv8_d128'))\n"
    "def run(*args):\n"
    "    output, lse = _run(*args)\n"
    "    output[2:] = 0\n"
    "    return output, lse\n"
)


def test_failing_prefill_property_saves_a_case_that_replays_on_cpu(tmp_path):
    (tmp_path / "prefill_defect.py").write_text(PREFILL_DEFECT)
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("properties/test_prefill.py::test_prefill_output_and_lse_within_error_bound", "-n", "0",
                        "-x", "--hypothesis-profile=ci", "--definition=gqa_ragged_prefill_causal_h32_kv8_d128",
                        f"--impl={tmp_path / 'prefill_defect.py'}:run", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    (path,) = (tmp_path / "failures").glob("*.pt")
    saved = casefiles.load_case(path)
    assert saved["case_repr"].startswith("PrefillCase(q_lens=(")
    assert isinstance(casefiles.case_from_fields(saved["case_fields"]), PrefillCase)

    replay = run_module("gqa_decode_fuzz.record.repro", str(path), "--device", "cpu", "--no-png", env=env)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "float64 prefill oracle" in replay.stdout and "output not within bound" in replay.stdout
    assert "reproduced on cpu" in replay.stdout

    fixed = run_module("gqa_decode_fuzz.record.repro", str(path), "--device", "cpu", "--no-png",
                       "--impl", "gqa_decode_fuzz.kernel:run", env=env)
    assert fixed.returncode == 0 and "did not reproduce" in fixed.stdout, fixed.stdout + fixed.stderr
