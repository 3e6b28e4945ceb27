"""The contract as data: Definition files are read right, refused when they are not GQA paged decode, and the
float64 oracle agrees with each built-in definition's own float32 reference."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from gqa_decode_fuzz.generation.cases import DecodeCase, build, using_definition
from gqa_decode_fuzz.reference import check_against_reference
from gqa_decode_fuzz.reference.definitions import BUILT_IN, DECODE, SEED, DefinitionError, from_json, load, select
from gqa_decode_fuzz.reference.oracle import attend, float32_scale

HERE = Path(__file__).resolve().parent
OTHER = HERE / "definitions" / "gqa_paged_decode_h16_kv2_d128_ps16.json"
FAMILY = {  # FlashInfer-Bench's flashinfer-trace GQA decode definitions: (query heads, KV heads, page size)
    (5, 1, 1), (6, 1, 1), (16, 2, 1), (20, 4, 1), (24, 8, 1), (32, 4, 1), (32, 8, 1), (32, 16, 1), (48, 8, 1),
    (6, 1, 64), (16, 2, 64), (20, 4, 64), (24, 4, 64), (24, 8, 64), (32, 4, 64), (32, 8, 64), (32, 16, 64),
}


def test_the_family_is_built_in():
    assert {(d.num_qo_heads, d.num_kv_heads, d.page_size) for d in BUILT_IN.values()} == FAMILY
    assert all(d.head_dim == 128 and d.name == f"gqa_paged_decode_h{d.num_qo_heads}_kv{d.num_kv_heads}_d128_ps"
               f"{d.page_size}" for d in BUILT_IN.values())
    assert SEED.arguments == ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale")
    paged = BUILT_IN["gqa_paged_decode_h20_kv4_d128_ps64"]
    assert paged.arguments[5] == "kv_last_page_len" and paged.group == 5 and paged.page_elements == 64 * 4 * 128


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_a_definition_survives_its_json(name):
    definition = BUILT_IN[name]
    assert from_json(definition.to_json()) == definition


def test_selection_by_name_list_file_and_all():
    assert select("all", op_types=(DECODE,)) == tuple(BUILT_IN.values())
    two = select("gqa_paged_decode_h5_kv1_d128_ps1, gqa_paged_decode_h32_kv8_d128_ps64")
    assert [d.name for d in two] == ["gqa_paged_decode_h5_kv1_d128_ps1", "gqa_paged_decode_h32_kv8_d128_ps64"]
    other = load(str(OTHER))
    assert (other.num_qo_heads, other.num_kv_heads, other.page_size) == (16, 2, 16) and other.origin == str(OTHER)
    with pytest.raises(DefinitionError, match="unknown definition 'gqa_paged_decode_h7'"):
        select("gqa_paged_decode_h7")


def _edited(edit) -> dict:
    data = copy.deepcopy(SEED.to_json())
    edit(data)
    return data


@pytest.mark.parametrize("edit, named", [
    (lambda d: d.update(op_type="mla_paged"), "op_type 'mla_paged' is not supported"),
    (lambda d: d.update(name="gqa_paged_prefill_causal_h32_kv4_d128_ps1"), "its name says prefill but its op_type"),
    (lambda d: d["axes"].update(num_qo_heads={"type": "var"}), "axis 'num_qo_heads' must be a const"),
    (lambda d: d["axes"].update(qo_indptr_len={"type": "var"}), "axes ['qo_indptr_len'] are not those"),
    (lambda d: d["axes"]["num_kv_heads"].update(value=5), "not a multiple of num_kv_heads=5"),
    (lambda d: d["axes"]["num_kv_heads"].update(value=8), "its name says h32 kv4 d128 ps1 but its axes say"),
    (lambda d: d["inputs"]["q"].update(dtype="float16"), "input 'q' is shape"),
    (lambda d: d["outputs"]["lse"].update(dtype="float16"), "output 'lse' is shape"),
    (lambda d: d["axes"]["page_size"].update(value=16) or d.update(name="x"), "inputs ['q', 'k_cache'"),
    (lambda d: d["constraints"].append("batch_size <= 64"), "constraints ['batch_size <= 64'] are not supported"),
])
def test_what_is_not_gqa_paged_decode_is_refused_naming_it(edit, named):
    with pytest.raises(DefinitionError, match=named.replace("[", r"\[").replace("(", r"\(")):
        from_json(_edited(edit))


def test_a_file_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(DefinitionError, match="not JSON"):
        load(str(path))


def _their_reference(definition):
    scope: dict = {}
    exec(compile(definition.reference, f"<{definition.name} reference>", "exec"), scope)  # noqa: S102 - our own data
    return scope["run"]


CASES = [
    DecodeCase(lengths=(3, 0, 70), page_layout="shuffled", spare_pages=3, seed=1),
    DecodeCase(lengths=(1, 64, 129), page_layout="shared_prefix", values="wide", seed=2),
    DecodeCase(lengths=(0,), seed=3),
    DecodeCase(lengths=(65, 2), page_layout="contiguous", spare_pages=2, pool_fill="noise", scale=0.3, seed=4),
]


@pytest.mark.parametrize("name", [*sorted(BUILT_IN), str(OTHER)])
def test_the_oracle_agrees_with_the_definitions_own_reference(name):
    """A definition misread is a wrong suite: its own float32 reference, a correct implementation, stays within
    our float64 oracle's bound on small cases of every kind (the bound is no looser for it: it is the same bound)."""
    definition = load(name)
    reference = _their_reference(definition)
    for case in CASES:
        with using_definition(definition):
            inputs = build(case)
        scale = float32_scale(case.scale, definition.head_dim)
        arguments = (*inputs.arguments()[:-1], scale)
        with torch.no_grad():
            output, lse = reference(*arguments)
        mismatches = check_against_reference(output, lse, attend(*inputs))
        assert all(m.ok for m in mismatches), (definition.name, case, [m.message for m in mismatches])


def test_the_other_definition_file_is_valid_json_of_the_family_format():
    data = json.loads(OTHER.read_text())
    assert data["op_type"] == "gqa_paged" and from_json(data).page_size == 16
