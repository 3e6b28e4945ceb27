"""Root causes: failures grouped by what their minimal cases need, learned by probing (record/causes.py).

In-process tests drive the experiment with torch implementations on tiny cases; one nested run puts the
planted one-defect kernel (tests/impls/nonpositive_scale_nan.py) through the suite and reads its summary.
"""

import dataclasses
import importlib
import json
import math
import os
import time
from pathlib import Path

import pytest
import torch

from gqa_decode_fuzz.engine import knobs
from gqa_decode_fuzz.engine.target import in_definition_order
from gqa_decode_fuzz.generation.cases import DecodeCase, definitions
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.record import causes
from gqa_decode_fuzz.record.causes import Budget, Failure, Prober
from gqa_decode_fuzz.runner import shards
from tests.corpus.materialise import seed_on_cpu
from tests.impls.nonpositive_scale_nan import run as nonpositive_scale_nan
from tests.impls.torch_float32 import run as torch_float32
from tests.pytest_runs import clean_environment, run_pytest

DECODE = "properties/test_decode.py::"
BOUND = DECODE + "test_output_and_lse_within_error_bound"
EMPTIES = DECODE + "test_empty_sequences_give_zero_output_and_negative_infinite_lse"
SCALES = "properties/test_hostile_values.py::test_tiny_and_huge_scales_stay_within_error_bound"
LAYOUTS = "properties/test_layouts.py::test_strided_and_sliced_inputs_give_the_right_answer_or_a_clear_error"
UNCHANGED = "properties/test_metamorphic.py::test_inputs_are_left_unchanged"
SINGLE_TOKEN = "properties/test_edge_shapes.py::test_single_token_sequences_stay_within_error_bound"
EXTREME = "properties/test_hostile_values.py::test_extreme_logits_stay_within_error_bound"


def two_defects(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """Wrong for a scale <= 0 (NaN) and, apart from that, for K with a head-dim stride other than 1."""
    output, lse = nonpositive_scale_nan(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    if k_cache.stride(-1) != 1:
        output = output + 1.0
    return output, lse


def _failures():
    return [
        Failure(f"{LAYOUTS}[dim_outer-shard1of2]", "b.pt", "AssertionError", case=DecodeCase(
            lengths=(2,), kv_layout="dim_outer", seed=5)),
        Failure(BOUND, "a.pt", "AssertionError", case=DecodeCase(lengths=(1,), scale=0.0)),
        Failure(EMPTIES, "c.pt", "AssertionError", case=DecodeCase(lengths=(0,), scale=-1e-6)),
        Failure(f"{SCALES}[shard2of2]", "d.pt", "AssertionError", case=DecodeCase(
            lengths=(2,), scale=-1e-6, values="constant_keys", seed=3)),
        Failure("properties/test_edge_shapes.py::test_batch_zero_gives_empty_results", "e.pt",
                "RuntimeError: CUDA error: an illegal memory access was encountered", crashed=True,
                case=DecodeCase(lengths=())),
        Failure("properties/test_precision.py::test_long_sequences_within_error_bound[normal]"),
        Failure("properties/test_precision.py::test_long_sequences_within_error_bound[wide]"),
    ]


def _prober(impl, **budget):
    """Probes of ``impl`` (the seed definition's arguments), called as the suite calls it."""
    return Prober(in_definition_order(impl, definitions.SEED), torch.device("cpu"), "correct", budget=Budget(**budget))


def declared_claim(prop: str) -> str:
    """The claim a property's test declares (``property_claim``), read from its module as a run records it."""
    path, _, function = prop.partition("::")
    module = importlib.import_module(f"gqa_decode_fuzz.properties.{Path(path).stem}")
    test = getattr(module, shards.property_name(function).partition("[")[0])
    (claim,) = [mark.args[0] for mark in test.pytestmark if mark.name == "claim"]
    return claim


def find_causes(failures: list[Failure], prober: Prober) -> list:
    """``causes.find_causes`` on ``failures`` with a case, each with its property's declared claim, as a run's case
    files give it."""
    return causes.find_causes([dataclasses.replace(f, claim=declared_claim(f.nodeid)) if f.case is not None else f
                               for f in failures], prober)


def test_one_defect_seen_by_several_properties_is_one_cause():
    failures = [f for f in _failures() if f.case is not None and f.case.kv_layout == "separate" and not f.crashed]
    prober = _prober(nonpositive_scale_nan)
    (cause,) = find_causes(failures, prober)
    assert cause.representative.prop == BOUND  # the simplest minimal case represents the cause
    assert cause.needs == ["scale <= 0"] and cause.free == ["any length"], prober.tried
    assert {member.prop for member, _ in cause.members} == {EMPTIES, SCALES}
    assert cause.summary == "scale <= 0, any length"
    # what was tried: its case, the default scale (passes), another scale <= 0, a longer batch; one per member
    assert prober.tried[:4] == [
        "test_output_and_lse_within_error_bound on DecodeCase(lengths=(1,), scale=0.0): fails",
        "test_output_and_lse_within_error_bound on DecodeCase(lengths=(1,)): passes",
        "test_output_and_lse_within_error_bound on DecodeCase(lengths=(1,), scale=-0.5): fails",
        "test_output_and_lse_within_error_bound on DecodeCase(lengths=(3, 130), scale=0.0): fails",
    ], prober.tried
    assert prober.budget.used == len(prober.tried) <= 8


def test_two_defects_are_two_causes_and_crashes_and_caseless_failures_stand_alone():
    prober = _prober(two_defects)
    found = find_causes(_failures(), prober)
    assert [cause.summary for cause in found[:2]] == ["scale <= 0, any length", "kv_layout dim_outer, any length"]
    assert found[0].properties == [BOUND, EMPTIES, SCALES]
    assert found[1].properties == [f"{LAYOUTS}[dim_outer]"]  # the shard parameter goes, the layout stays
    assert found[2].note.startswith("crashed: not probed") and found[2].representative.crashed
    assert found[3].note.startswith("no case descriptor") and found[3].representative.case_file is None
    assert len(found) == 4 and len(found[3].properties) == 2  # one test function's parametrizations together
    assert not prober.stopped


def test_a_property_needing_something_else_does_not_join():
    """Inputs-unchanged on a scale <= 0 case: its claim holds there (this kernel writes no input), so it is not
    swept into the scale cause even though its case has the scale."""
    failures = [*(_failures()[1:3]), Failure(UNCHANGED, "u.pt", "AssertionError", case=DecodeCase(
        lengths=(1,), scale=0.0, spare_pages=3))]
    prober = _prober(nonpositive_scale_nan)
    found = find_causes(failures, prober)
    assert [cause.properties for cause in found] == [[BOUND, EMPTIES], [UNCHANGED]]
    assert "passed on its case when probed" in found[1].note


def test_the_budget_bounds_the_probes_and_the_report_says_so():
    prober = _prober(two_defects, probes=3)
    found = find_causes(_failures(), prober)
    assert prober.budget.used == 3 and "budget spent" in prober.stopped
    assert any(cause.note.startswith("not probed: budget spent") for cause in found)
    lines = causes.summary_lines(causes.as_json(found, prober))
    unprobed = sum(cause.unprobed for cause in found)
    assert lines[0] == (f"{len(found)} distinct failures ({unprobed} of them failures not probed, one entry per "
                        "property)")
    assert lines[-1].startswith("(grouped by 3 probes of at most 3") and "budget spent" in lines[-1]


def test_the_clean_up_after_each_probe_counts_against_the_seconds():
    """A probe's clean-up (its release of the device's memory) is part of the budget's seconds: the budget bounds
    the grouping's wall time."""
    prober = _prober(two_defects, probes=1000, seconds=0.5)
    prober.release = lambda: time.sleep(0.2)
    find_causes(_failures(), prober)
    assert prober.budget.used <= 3 and prober.budget.spent >= 0.5 and "budget spent" in prober.stopped


def test_failures_left_unprobed_are_one_entry_per_property_not_one_per_failure():
    """A widely failing kernel leaves a thousand failures once the probes' budget is spent (FlashInfer over the
    decode family): each property's are listed together, under a note that they were not grouped by cause."""
    scales = [Failure(f"{SCALES}[shard{n}of4]", f"{n}.pt", "AssertionError", case=DecodeCase(lengths=(n,), scale=-1.0))
              for n in range(1, 5)]
    bound = Failure(BOUND, "b.pt", "AssertionError", case=DecodeCase(lengths=(1,), scale=0.0))
    prober = _prober(nonpositive_scale_nan, probes=0)
    found = find_causes([*scales, bound], prober)
    assert [sorted(cause.properties) for cause in found] == [[BOUND], sorted(f.prop for f in scales)]
    assert all(cause.unprobed and cause.note.startswith("not probed: budget spent")
               and "not grouped by cause" in cause.note for cause in found)


def test_a_time_budget_bounds_the_probes_but_leaves_the_simplest_failures_some():
    assert Budget.for_failures(1000) == Budget(probes=6000, seconds=300.0)
    assert Budget.for_failures(1000, seconds_left=100.0).seconds == 100.0
    assert Budget.for_failures(1000, seconds_left=-5.0).seconds == causes.SECONDS_PAST_A_TIME_BUDGET
    assert Budget.for_failures(2, seconds_left=1000.0).seconds == Budget.seconds


def test_failures_of_run_reads_case_files_and_adds_caseless_failures(tmp_path):
    from gqa_decode_fuzz.generation.cases import build
    from gqa_decode_fuzz.record import casefiles

    recorder = casefiles.Recorder()
    recorder.begin(f"{BOUND}[shard1of2]", claims.within_bound.reference)
    recorder.note_build(DecodeCase(lengths=(1,), scale=0.0), build(DecodeCase(lengths=(1,), scale=0.0)))
    path = casefiles.save_case(tmp_path, recorder, error="AssertionError: off", impl_spec="x:run",
                               device=torch.device("cpu"), profile="ci", run_id="r")
    recorder.begin("properties/test_metamorphic.py::test_repeating_a_call_gives_the_same_answer")
    first, second = DecodeCase(lengths=(2,), scale=0.0), DecodeCase(lengths=(3,))
    recorder.note_claim(first, {"other": second}, claims.repeated.reference)  # declared none: the one it calls
    recorder.note_build(first, build(first))
    recorder.note_build(second, build(second))  # built last, but the claim is about the first
    repeated = casefiles.save_case(tmp_path, recorder, error="AssertionError: off", impl_spec="x:run",
                                   device=torch.device("cpu"), profile="ci", run_id="r")
    index = casefiles.runs_index(tmp_path, "r")
    failures = causes.failures_of_run(index, [f"{BOUND}[shard2of2]", EMPTIES])
    assert [(f.prop, f.case_file, f.case, f.draws, f.claim) for f in failures] == [
        (BOUND, str(path), DecodeCase(lengths=(1,), scale=0.0), {}, claims.within_bound.reference),
        ("properties/test_metamorphic.py::test_repeating_a_call_gives_the_same_answer", str(repeated), first,
         {"other": second}, claims.repeated.reference),
        (EMPTIES, None, None, {}, None)]


def wrong_with_20_heads(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """Right under the seed's definition, off by one under any with 20 query heads."""
    output, lse = torch_float32(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    return (output + 1.0, lse) if q.shape[1] == 20 else (output, lse)


def test_a_failure_only_under_another_definition_says_so():
    h20 = "gqa_paged_decode_h20_kv4_d128_ps1"
    failures = [Failure(f"{BOUND}[{h20}-shard1of2]", "a.pt", "AssertionError",
                        case=DecodeCase(lengths=(2,), definition=h20, seed=3)),
                Failure(f"{SINGLE_TOKEN}[{h20}]", "b.pt", "AssertionError",
                        case=DecodeCase(lengths=(1,), definition=h20))]
    (cause,) = find_causes(failures, _prober(wrong_with_20_heads))
    assert cause.needs == [f"definition {h20} (the seed's passes)"], cause.needs
    assert cause.properties == [f"{SINGLE_TOKEN}[{h20}]", f"{BOUND}[{h20}]"]


def wrong_with_20_heads_or_nonpositive_scales(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    output, lse = wrong_with_20_heads(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    return (output * math.nan, lse) if sm_scale is not None and sm_scale <= 0 else (output, lse)


def test_a_failure_under_another_definition_joins_only_where_its_own_definition_fails_the_same_way():
    """Another property failing under a third definition for a reason of its own (scale 0) does not join the
    cause that needs definition h20, though the representative's case (under h20) fails its check too."""
    h20, h24 = "gqa_paged_decode_h20_kv4_d128_ps1", "gqa_paged_decode_h24_kv8_d128_ps1"
    failures = [Failure(f"{BOUND}[{h20}-shard1of2]", "a.pt", "AssertionError", case=DecodeCase((2,), definition=h20)),
                Failure(f"{SCALES}[{h24}-shard1of2]", "b.pt", "AssertionError",
                        case=DecodeCase((3,), scale=0.0, definition=h24))]
    found = find_causes(failures, _prober(wrong_with_20_heads_or_nonpositive_scales))
    assert [cause.needs for cause in found] == [[f"definition {h20} (the seed's passes)"], ["scale <= 0"]], found


def wrong_with_20_heads_or_large_scales_with_24_heads(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    output, lse = wrong_with_20_heads(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    return (output * math.nan, lse) if q.shape[1] == 24 and sm_scale is not None and sm_scale > 1 else (output, lse)


def test_a_failure_that_needs_its_own_definition_for_another_reason_does_not_join_by_leaving_it():
    """A member under h24 that fails only with scale > 1 there passes once its definition goes to the seed's, as
    the representative's (h20) would: leaving the definition says nothing of a shared cause, so it does not join."""
    h20, h24 = "gqa_paged_decode_h20_kv4_d128_ps1", "gqa_paged_decode_h24_kv8_d128_ps1"
    failures = [Failure(f"{BOUND}[{h20}-shard1of2]", "a.pt", "AssertionError", case=DecodeCase((2,), definition=h20)),
                Failure(f"{SCALES}[{h24}-shard1of2]", "b.pt", "AssertionError",
                        case=DecodeCase((3,), scale=8.0, definition=h24))]
    found = find_causes(failures, _prober(wrong_with_20_heads_or_large_scales_with_24_heads))
    assert [cause.properties for cause in found] == [[f"{BOUND}[{h20}]"], [f"{SCALES}[{h24}]"]], found


def test_an_explicit_example_found_under_another_definition_is_probed_under_it(tmp_path):
    """An explicit example's case names no definition: its case file's definition is written into it, so a family
    run's probe of it builds it for that definition, not the seed's."""
    from gqa_decode_fuzz.generation.cases import build, using_definition
    from gqa_decode_fuzz.record import casefiles

    other = definitions.by_name("gqa_paged_decode_h20_kv4_d128_ps64")
    recorder = casefiles.Recorder()
    recorder.begin(f"{BOUND}[{other.name}-shard1of2]")
    with using_definition(other):
        recorder.note_build(DecodeCase(lengths=(0,)), build(DecodeCase(lengths=(0,))))
        casefiles.save_case(tmp_path, recorder, error="AssertionError: off", impl_spec="x:run",
                            device=torch.device("cpu"), profile="ci", run_id="r")
    (failure,) = causes.failures_of_run(casefiles.runs_index(tmp_path, "r"), [])
    assert failure.case == DecodeCase(lengths=(0,), definition=other.name)


BAD_INPUT_EACH = "properties/test_bad_input.py::test_each_corruption_is_handled"


def finite_sentinel(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """FlashInfer's -5e4 mask sentinel, in effect: a head whose every logit lies below it gets output 0 and an LSE
    pinned there (seen on the H200, docs/findings.md)."""
    output, lse = torch_float32(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    dropped = lse < -5e4
    return output.masked_fill(dropped[..., None], 0.0), lse.masked_fill(dropped, -5e4)


def test_a_finite_sentinel_reached_through_several_value_regimes_is_one_cause():
    """Large logits at scale 8, very negative ones at scale 8 and the beyond-sentinel regime each put a head far
    below zero: one defect, where field by field they would be three causes (FlashInfer's default path, H200)."""
    failures = [
        Failure(SINGLE_TOKEN, "a.pt", "AssertionError", case=DecodeCase(lengths=(1,), scale=8.0,
                                                                         values="large_logits")),
        Failure(BOUND, "b.pt", "AssertionError", case=DecodeCase(lengths=(1,), scale=8.0, values="very_negative")),
        Failure(EXTREME, "c.pt", "AssertionError", case=DecodeCase(lengths=(3, 130), values="beyond_sentinel",
                                                                   seed=1)),
    ]
    prober = _prober(finite_sentinel)
    (cause,) = find_causes(failures, prober)
    assert cause.needs == [causes.FAR_BELOW_WORDS], (cause.needs, prober.tried)
    assert set(cause.properties) == {SINGLE_TOKEN, BOUND, EXTREME}


def test_the_far_below_test_takes_a_case_only_as_large_as_the_probers_device_holds(monkeypatch):
    """The derived test builds the case on the prober's device, within that device's size: a case over the CPU's
    limit is not said to be far below zero there (its need stays field by field), though it is."""
    case = DecodeCase(lengths=(3, 130), scale=8.0, values="very_negative")
    assert causes._far_below_zero(case, torch.device("cpu"))
    monkeypatch.setitem(causes.DERIVED_TOKENS, "cpu", 100)
    assert not causes._far_below_zero(case, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_finite_sentinel_on_a_128k_token_sequence_is_the_far_below_cause_on_a_gpu():
    """A 128k-token case is too large for the CPU's derived test (FlashInfer's sweep had the sentinel as three causes,
    docs/gpu.md section 49): probed on a GPU, it folds into the one cause of heads far below zero."""
    failures = [
        Failure(BOUND, "a.pt", "AssertionError", case=DecodeCase(lengths=(1,), scale=8.0, values="very_negative")),
        Failure("properties/test_edge_shapes.py::test_128k_token_sequences_stay_within_error_bound", "b.pt",
                "AssertionError", case=DecodeCase(lengths=(131072, 2), scale=27.0, values="very_negative", seed=5)),
    ]
    prober = Prober(in_definition_order(finite_sentinel, definitions.SEED), torch.device("cuda"), "correct",
                    budget=Budget())
    (cause,) = find_causes(failures, prober)
    assert cause.needs == [causes.FAR_BELOW_WORDS], (cause.needs, prober.tried)


def test_a_need_of_the_scale_alone_is_not_taken_for_logits_far_below_zero():
    (cause,) = find_causes([Failure(BOUND, "a.pt", "AssertionError", case=DecodeCase(lengths=(1,), scale=0.0))],
                           _prober(nonpositive_scale_nan))
    assert cause.needs == ["scale <= 0"] and not causes._far_below_zero(cause.representative.case)


def test_input_validation_missing_is_one_cause_listing_each_corruption():
    """An implementation that checks no input (torch_float32): the bad-input property's minimal case and two
    entries of the table (case files of their own since each names its claim's corruption) are one cause, however
    many corruptions; a case-decided failure beside them stays apart."""

    def checks_nothing(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
        output, lse = torch_float32(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
        return (output * math.nan, lse) if sm_scale is not None and sm_scale <= 0 else (output, lse)

    failures = [
        Failure(BAD_INPUT, "b.pt", "AssertionError", case=DecodeCase(lengths=(1,)),
                draws={"corruption": "q_float16", "where": 3}),
        Failure(f"{BAD_INPUT_EACH}[page_id_negative]", "p.pt", "AssertionError", case=DecodeCase(
            lengths=(2, 0, 3), spare_pages=1), draws={"corruption": "page_id_negative", "then_valid": False}),
        Failure(f"{BAD_INPUT_EACH}[kv_indptr_not_monotonic]", "k.pt", "AssertionError", case=DecodeCase(
            lengths=(2, 0, 3), spare_pages=1), draws={"corruption": "kv_indptr_not_monotonic", "then_valid": False}),
        Failure(BOUND, "a.pt", "AssertionError", case=DecodeCase(lengths=(1,), scale=0.0)),
    ]
    prober = _prober(checks_nothing)
    found = find_causes(failures, prober)
    assert [cause.properties for cause in found] == [
        [BAD_INPUT, f"{BAD_INPUT_EACH}[page_id_negative]", f"{BAD_INPUT_EACH}[kv_indptr_not_monotonic]"], [BOUND]
    ], prober.tried
    validation = found[0]
    assert validation.needs[0].startswith("corruption kv_indptr_not_monotonic, page_id_negative, q_float16"), \
        validation.needs
    assert prober.budget.used <= 12, prober.tried


def test_a_one_defect_kernel_is_one_cause_in_the_summary_and_the_report(tmp_path):
    """The whole suite, under xdist (the controller probes; tests/test_shrink_memory.py sees the summary of a run
    without xdist): relational properties (a repeated call, a poisoned page) and the bad-input property, whose
    valid call after the refused one fails, join the cause too: each probe replays its property's own draws."""
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR=str(tmp_path / "reports"), CI="true")
    result = run_pytest("properties", "-n", "2", "--impl=tests/impls/nonpositive_scale_nan.py:run", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) >= 10, output
    assert "gqa-decode: 1 distinct failure (root causes, grouped by probing)" in result.stdout, output
    assert "1. scale <= 0, any length: " in result.stdout
    assert "replay: python -m gqa_decode_fuzz.record.repro" in result.stdout
    (report,) = (tmp_path / "reports").glob("*/report.json")
    saved = json.loads(report.read_text())
    assert next(iter(saved)) == "causes"  # report.json leads with them, as report.md does
    (cause,) = saved["causes"]["causes"]
    assert cause["needs"] == ["scale <= 0"] and len(cause["properties"]) == len(failed)
    assert cause["representative"]["case_file"] and cause["representative"]["replay"]
    joined = {prop.rpartition("::")[2] for prop in cause["properties"]}
    assert {"test_repeating_a_call_gives_the_same_answer", "test_bad_input_is_refused_and_the_next_call_works",
            "test_nan_in_a_referenced_page_stays_in_the_sequences_reading_it"} <= joined, cause["properties"]
    text = report.with_name("report.md").read_text()
    assert text.index("## 1 distinct failure") < text.index("| property | verdict")


BAD_INPUT = "properties/test_bad_input.py::test_bad_input_is_refused_and_the_next_call_works"


@pytest.mark.skipif(os.environ.get("GQA_DECODE_SLOW_TESTS") != "1",
                    reason="slow (about a minute on 2 cores; the seed reads out of bounds in the interpreter): "
                           "set GQA_DECODE_SLOW_TESTS=1")
def test_the_verbatim_seed_gives_its_distinct_defects_as_distinct_causes(tmp_path):
    """The seed (its CUDA gate removed, tests/corpus/materialise.py) reads no last-dimension stride and checks no
    input (docs/mutants.md; its int32 offsets need a GPU's huge pools): two causes, not one per property."""
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR=str(tmp_path / "reports"), CI="true")
    result = run_pytest("properties/test_layouts.py", BAD_INPUT, "-n", "1", "--max-examples=10",
                        f"--impl={seed_on_cpu(tmp_path)}", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    (saved,) = (tmp_path / "reports").glob("*/causes.json")
    found = json.loads(saved.read_text())["causes"]
    assert len(found) == 2, found
    strides, bad_input = sorted(found, key=lambda cause: cause["properties"] == [BAD_INPUT])
    assert len(strides["properties"]) >= 4 and all("test_layouts.py" in p for p in strides["properties"])
    assert any(layout in strides["summary"] for layout in ("q_layout dim_outer", "q_layout strided_dim",
                                                            "kv_layout dim_outer")), strides
    assert bad_input["properties"] == [BAD_INPUT] and bad_input["summary"].startswith("corruption "), bad_input


def test_a_cause_the_draws_decide_takes_no_other_claim_that_fails_on_its_case():
    """Two defects, no input checks and every output scaled: the bad-input cause (its draws decide it) comes first,
    and the central bound also fails on its plain case, for its own defect: two causes, not one."""

    def checks_nothing_and_scales(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
        output, lse = torch_float32(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
        return output * 1.02, lse

    failures = [
        Failure(BAD_INPUT, "b.pt", "AssertionError", case=DecodeCase(lengths=(1,)),
                draws={"corruption": "q_float16", "where": 3}),
        Failure(BOUND, "a.pt", "AssertionError", case=DecodeCase(lengths=(2,))),
    ]
    prober = _prober(checks_nothing_and_scales)
    found = find_causes(failures, prober)
    assert [cause.properties for cause in found] == [[BAD_INPUT], [BOUND]], prober.tried


def test_a_strict_bad_input_failure_is_probed_as_failing_not_a_crash_of_the_grouping():
    """Under the strict tier the bad-input claim demands the contract's own error. A kernel that computes the bad
    call instead fails the claim with an AssertionError, which a probe reads as the claim failing (pytest.raises'
    Failed, a BaseException, escaped the probe and ended the run's report)."""
    failure = dataclasses.replace(
        Failure(BAD_INPUT, "b.pt", "AssertionError", case=DecodeCase(lengths=(1,)),
                draws={"corruption": "sm_scale_nan", "where": 0}), claim=declared_claim(BAD_INPUT))
    prober = Prober(in_definition_order(torch_float32, definitions.SEED), torch.device("cpu"), "strict")
    assert prober.fails(failure, failure.case) is True, prober.tried


@pytest.mark.parametrize(("outcome", "verdict"), [(pytest.fail, True), (pytest.skip, None)])
def test_a_claim_ending_by_pytest_s_own_outcome_is_read_not_a_crash_of_the_grouping(monkeypatch, outcome, verdict):
    """A claim may end by ``pytest.fail`` or ``pytest.skip``, whose exceptions are BaseExceptions: the probe reads
    the first as the claim failing and the second as undecided, as a test would, rather than let either escape."""
    def claim(impl, case, device, contract):
        outcome("said by the claim")

    monkeypatch.setattr(causes, "claim_at", lambda reference: claim)
    failure = Failure("properties/test_x.py::test_y", "y.pt", "Failed", case=DecodeCase(lengths=(1,)),
                      claim="properties.claims:said")
    prober = Prober(torch_float32, torch.device("cpu"), "lenient")
    assert prober.fails(failure, failure.case) is verdict, prober.tried
    assert prober.stopped is None


def _wrong_where_q_sums_above_zero(q, *args, **kwargs):
    """A defect only some values reach: the output is off by one wherever q's elements sum above zero."""
    output, lse = torch_float32(q, *args, **kwargs)
    return (output + 1 if q.float().sum() > 0 else output), lse


def test_failures_that_need_particular_values_are_one_cause_whatever_their_seeds():
    """Seeds 3 and 4 reach the defect, seed 0 does not: two properties failing under either seed are one cause,
    a need of values (as a split-KV precision defect of FlashInfer's was one cause per seed before)."""
    failures = [Failure(BOUND, "b.pt", "AssertionError", case=DecodeCase(lengths=(1,), seed=3)),
                Failure(SINGLE_TOKEN, "s.pt", "AssertionError", case=DecodeCase(lengths=(1,), seed=4))]
    (cause,) = find_causes(failures, _prober(_wrong_where_q_sums_above_zero, probes=100, seconds=100))
    assert cause.needs == ["particular values (seed 3 fails, seed 0 passes)"], cause.summary
    assert cause.properties == [BOUND, SINGLE_TOKEN]


BLOCK_EDGES = "properties/test_edge_shapes.py::test_lengths_at_block_edges_stay_within_error_bound"


def _two_paths(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None, path="plain"):
    """Two code paths behind a knob, each with a defect of its own that needs a length: the "fast" path is wrong
    for any sequence of two or more tokens, the "plain" one from five tokens on (as FlashInfer's tensor-core path
    and its split-KV partials are wrong on sequences of their own)."""
    output, lse = torch_float32(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    longest = int((kv_indptr[1:] - kv_indptr[:-1]).max()) if kv_indptr.numel() > 1 else 0
    wrong = longest >= (2 if path == "fast" else 5)
    return (output + 1 if wrong else output), lse


def test_a_failure_on_another_knob_path_joins_only_where_the_representatives_case_fails_there():
    """A failure that needs what a cause needs (a sequence of two or more tokens) joins it only where it ran the
    knob values the cause needs and the representative's, or the representative's case fails with its own: the
    plain path's defect is a cause of its own beside the fast path's, though both pass once their lengths go to
    the default, and another fast-path failure joins the fast path's."""
    fast, plain = {"path": "fast"}, {"path": "plain"}
    failures = [Failure(BOUND, "a.pt", "AssertionError", case=DecodeCase(lengths=(2,)), knobs=fast),
                Failure(BLOCK_EDGES, "b.pt", "AssertionError", case=DecodeCase(lengths=(7,)), knobs=plain),
                Failure(SINGLE_TOKEN, "c.pt", "AssertionError", case=DecodeCase(lengths=(1, 7)), knobs=fast)]
    prober = _prober(_two_paths, probes=100, seconds=100)
    prober.knob_defaults = knobs.defaults({"path": ("plain", "fast")})
    found = find_causes(failures, prober)
    assert [cause.properties for cause in found] == [[BOUND, SINGLE_TOKEN], [BLOCK_EDGES]], prober.tried
    # the knob is a need where its default passes, and said first: the two causes read apart
    assert found[0].needs == ["path='fast'", "a sequence of 2 or more tokens"], found[0].summary
    probed = "test_output_and_lse_within_error_bound on DecodeCase(lengths=(2,)) with path='plain': passes"
    assert probed in prober.tried, prober.tried
    assert found[1].needs == ["a sequence of 2 or more tokens"], found[1].summary
    assert found[1].representative.knobs == plain
