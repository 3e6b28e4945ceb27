"""The contract's op types: FlashInfer-Bench's causal prefill Definition files (paged and ragged) are read right,
refused naming what where they are not of a known kind, and selected by op type; the property suite runs each
property under the definitions of its own op type."""

from __future__ import annotations

import copy
import json

import pytest

from gqa_decode_fuzz.reference.definitions import (
    ALL_BUILT_IN,
    BUILT_IN,
    DECODE,
    OP_TYPES,
    PAGED_PREFILL,
    PREFILL,
    RAGGED_PREFILL,
    DefinitionError,
    built_in,
    by_name,
    check_op_types,
    from_json,
    load,
    select,
)
from tests.pytest_runs import clean_environment, run_pytest

PAGED_FAMILY = {  # flashinfer-trace's gqa_paged_prefill_causal definitions: (query heads, KV heads, page size)
    (16, 2, 1), (20, 4, 1), (24, 4, 1), (24, 8, 1), (32, 16, 1), (32, 4, 1), (32, 8, 1), (40, 10, 1), (5, 1, 1),
    (6, 1, 1),
    (16, 1, 64), (16, 2, 64), (20, 4, 64), (24, 4, 64), (24, 8, 64), (32, 16, 64), (32, 4, 64), (32, 8, 64),
    (5, 1, 64), (6, 1, 64),
}
RAGGED_FAMILY = {  # gqa_ragged_prefill_causal: (query heads, KV heads, head dim)
    (16, 2, 128), (20, 4, 128), (24, 8, 128), (32, 16, 128), (32, 4, 128), (32, 8, 128), (5, 1, 128), (6, 1, 128),
    (8, 1, 256),
}
PAGED_1 = "gqa_paged_prefill_causal_h32_kv4_d128_ps1"
PAGED_64 = "gqa_paged_prefill_causal_h32_kv4_d128_ps64"
RAGGED = "gqa_ragged_prefill_causal_h8_kv1_d256"


def test_the_prefill_families_are_built_in():
    paged, ragged = built_in(PAGED_PREFILL), built_in(RAGGED_PREFILL)
    assert {(d.num_qo_heads, d.num_kv_heads, d.page_size) for d in paged.values()} == PAGED_FAMILY
    assert {(d.num_qo_heads, d.num_kv_heads, d.head_dim) for d in ragged.values()} == RAGGED_FAMILY
    assert all(d.name == f"gqa_paged_prefill_causal_h{d.num_qo_heads}_kv{d.num_kv_heads}_d128_ps{d.page_size}"
               for d in paged.values())
    assert all(d.name == f"gqa_ragged_prefill_causal_h{d.num_qo_heads}_kv{d.num_kv_heads}_d{d.head_dim}"
               and d.page_size == 0 for d in ragged.values())
    assert len(ALL_BUILT_IN) == 17 + 20 + 9 and BUILT_IN == built_in(DECODE)
    assert [d.op_type for d in ALL_BUILT_IN.values()] == sorted((d.op_type for d in ALL_BUILT_IN.values()),
                                                                 key=OP_TYPES.index)


def test_each_op_type_has_its_arguments():
    assert by_name(PAGED_1).arguments == ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices",
                                          "sm_scale")
    assert by_name(PAGED_64).arguments == ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices",
                                           "kv_last_page_len", "sm_scale")
    ragged = by_name(RAGGED)
    assert ragged.arguments == ("q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale") and ragged.prefill
    assert ragged.head_dim == 256 and ragged.group == 8 and ragged.default_sm_scale == 1 / 16
    assert "ragged K/V" in ragged.summary() and by_name(PAGED_64).paged and not by_name(PAGED_1).paged


@pytest.mark.parametrize("name", sorted(set(ALL_BUILT_IN) - set(BUILT_IN)))
def test_a_prefill_definition_survives_its_json(name):
    definition = ALL_BUILT_IN[name]
    assert from_json(definition.to_json()) == definition
    assert from_json(json.loads(json.dumps(definition.to_json()))).op_type == definition.op_type


def test_selection_by_op_type_list_and_all():
    assert select("all") == tuple(ALL_BUILT_IN.values())
    assert select("decode") == tuple(BUILT_IN.values())
    assert select("prefill") == tuple(built_in(*PREFILL).values())
    assert {d.op_type for d in select("paged_prefill")} == {PAGED_PREFILL} and len(select("ragged_prefill")) == 9
    assert [d.name for d in select(f"{RAGGED}, decode, {RAGGED}")] == [RAGGED, *BUILT_IN]
    assert select("all", op_types=(DECODE,)) == tuple(BUILT_IN.values())  # a caller that takes decode only


@pytest.mark.parametrize("spec, named", [
    ("prefill", "--definition=prefill selects GQA paged causal prefill and GQA ragged causal prefill definitions"),
    ("ragged_prefill", "--definition=ragged_prefill selects GQA ragged causal prefill definitions"),
    (f"decode,{PAGED_64}", f"definition '{PAGED_64}' is GQA paged causal prefill"),
])
def test_a_caller_that_takes_decode_only_refuses_prefill_naming_why(spec, named):
    with pytest.raises(DefinitionError, match=f"{named}.*only GQA paged decode definitions are taken here: none yet"):
        select(spec, op_types=(DECODE,), reason="none yet")


def test_check_op_types_names_the_first_outsider():
    check_op_types(BUILT_IN.values(), (DECODE,))
    with pytest.raises(DefinitionError, match=f"'{RAGGED}' is GQA ragged causal prefill"):
        check_op_types([by_name(RAGGED)], (DECODE, PAGED_PREFILL))


def _edited(name: str, edit) -> dict:
    data = copy.deepcopy(by_name(name).to_json())
    edit(data)
    return data


def test_the_benchmarks_own_variants_are_read():
    """Six of the benchmark's paged-prefill files declare kv_last_page_len over len_indptr and no batch_size
    axis; its files carry prose and descriptions ours do not: the same contract."""
    def benchmark_form(d):
        d["inputs"]["kv_last_page_len"]["shape"] = ["len_indptr"]
        del d["axes"]["batch_size"]
        d["description"] = "another description"
        d["axes"]["num_qo_heads"]["description"] = "query heads"
        d["tags"] = ["stage:prefill", "status:verified"]

    assert from_json(_edited(PAGED_64, benchmark_form)) == by_name(PAGED_64)
    constrained = _edited(RAGGED, lambda d: d["constraints"].append("len_indptr == batch_size + 1"))
    assert from_json(constrained) == by_name(RAGGED)


def test_a_prefill_file_of_a_shape_not_built_in_is_read(tmp_path):
    def other(d):
        d["name"] = "my_ragged_prefill_causal"
        d["axes"]["num_qo_heads"]["value"], d["axes"]["head_dim"]["value"] = 12, 64

    path = tmp_path / "other.json"
    path.write_text(json.dumps(_edited(RAGGED, other)))
    definition = load(str(path))
    assert (definition.op_type, definition.num_qo_heads, definition.head_dim) == (RAGGED_PREFILL, 12, 64)
    assert definition.origin == str(path)


@pytest.mark.parametrize("name, edit, named", [
    (PAGED_1, lambda d: d.update(name="gqa_paged_prefill_h32_kv4_d128_ps1"), "does not say causal"),
    (PAGED_1, lambda d: d.update(name="gqa_paged_decode_h32_kv4_d128_ps1"),
     "its name says decode but its op_type 'gqa_paged' and inputs are those of GQA paged causal prefill"),
    (PAGED_1, lambda d: d.update(tags=["stage:decode"]), "its tag 'stage:decode' says decode"),
    (RAGGED, lambda d: d.update(op_type="gqa_paged"), "axes ['total_kv'] are not those of GQA paged causal prefill"),
    (RAGGED, lambda d: d["axes"].update(page_size={"type": "const", "value": 1}), "axes ['page_size'] are not"),
    (RAGGED, lambda d: d["axes"]["head_dim"].update(value=128), "its name says h8 kv1 d256 but its axes say"),
    (RAGGED, lambda d: d["axes"].update(total_kv={"type": "const", "value": 9}), "axis 'total_kv' must be a var"),
    (PAGED_64, lambda d: d["inputs"].pop("kv_last_page_len"), "takes ['q', 'k_cache', 'v_cache', 'qo_indptr'"),
    (PAGED_64, lambda d: d["inputs"]["qo_indptr"].update(dtype="int64"), "input 'qo_indptr' is shape"),
    (PAGED_64, lambda d: d["outputs"]["lse"].update(shape=["batch_size", "num_qo_heads"]), "output 'lse' is shape"),
    (PAGED_64, lambda d: d["constraints"].append("total_q <= 4096"), "constraints ['total_q <= 4096'] are not"),
    (RAGGED, lambda d: d.update(op_type="gqa_ragged_decode"), "op_type 'gqa_ragged_decode' is not supported"),
])
def test_what_is_not_a_known_prefill_is_refused_naming_it(name, edit, named):
    with pytest.raises(DefinitionError, match=named.replace("[", r"\[").replace("(", r"\(")):
        from_json(_edited(name, edit))


def _suite(tmp_path, *args: str):
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    return run_pytest("-n", "0", "--hypothesis-profile=ci", "-q", *args, env=env, timeout=600)


@pytest.mark.parametrize("spec", [RAGGED, "prefill"])
def test_the_property_suite_deselects_decode_properties_for_prefill_definitions(tmp_path, spec):
    result = _suite(tmp_path, "properties/test_decode.py", "--collect-only", f"--definition={spec}")
    assert result.returncode == 5, result.stdout + result.stderr  # every decode property deselected: none to run
    assert "deselected" in result.stdout, result.stdout + result.stderr


def test_the_property_suite_runs_a_prefill_file_of_a_shape_not_built_in(tmp_path):
    """12 query heads over 3 KV heads of head dim 64 is in no built-in file: the suite runs the own kernel on it."""
    def other(d):
        d["name"] = "my_ragged_prefill_causal"
        d["axes"]["num_qo_heads"]["value"], d["axes"]["num_kv_heads"]["value"] = 12, 3
        d["axes"]["head_dim"]["value"] = 64

    path = tmp_path / "other.json"
    path.write_text(json.dumps(_edited(RAGGED, other)))
    result = _suite(tmp_path, "properties/test_prefill.py", "-k", "output_and_lse_within_error_bound",
                    f"--definition={path}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "definition my_ragged_prefill_causal" in result.stdout, result.stdout
