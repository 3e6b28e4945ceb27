"""adapters/ for causal prefill, on CPU: PyTorch's math attention (adapters/torch_sdpa_prefill.py) against the prefill
oracle and under the property suite; the fused torch backends' bindings on meta tensors and their refusal of CPU
tensors; adapters/flashinfer_prefill.py's refusal to import without FlashInfer (its H200 run: docs/adapters.md)."""

import importlib.util
import math
import sys
import types
import warnings

import pytest
import torch

from adapters import _paged, torch_sdpa_prefill
from gqa_decode_fuzz.generation.oracles import oracle_of
from gqa_decode_fuzz.generation.prefill_cases import PrefillCase, build_prefill
from gqa_decode_fuzz.reference import assert_within_bound, definitions
from tests.pytest_runs import clean_environment, run_pytest

PAGED_PS1, PAGED_PS64 = "gqa_paged_prefill_causal_h32_kv4_d128_ps1", "gqa_paged_prefill_causal_h32_kv8_d128_ps64"
RAGGED_D256 = "gqa_ragged_prefill_causal_h8_kv1_d256"
# A fresh prefill; more queries than keys (rows 0..2 see nothing); no queries; queries over no keys; a short chunk
# after a long prefix; one query (decode).
Q_LENS, KV_LENS = (5, 6, 0, 3, 3, 1), (5, 3, 4, 0, 130, 65)
FUSED = ("flash", "efficient", "cudnn")


def _math_call(name: str, **case) -> tuple:
    inputs = build_prefill(PrefillCase(q_lens=Q_LENS, kv_lens=KV_LENS, definition=name, **case), observe=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that q_len > kv_len rows see nothing
        result = torch_sdpa_prefill.math.for_definition(definitions.by_name(name))(*inputs.arguments())
    return inputs, result


@pytest.mark.parametrize("name", [PAGED_PS1, PAGED_PS64, RAGGED_D256])
def test_torch_math_prefill_is_within_the_oracles_bound(name):
    inputs, (output, lse) = _math_call(name, scale=0.1, page_layout="shuffled", pool_fill="nan")
    assert output.shape == inputs.q.shape and output.dtype == torch.bfloat16
    assert lse.shape == inputs.q.shape[:2] and lse.dtype == torch.float32
    assert_within_bound(output, lse, oracle_of(inputs), context=name)


def test_torch_math_prefill_rows_that_see_no_key_are_the_backends_zero_and_the_adapters_negative_infinity():
    """math's safe softmax gives 0 for a fully masked row; the adapter's logsumexp over no key is -inf."""
    case = PrefillCase(q_lens=Q_LENS, kv_lens=KV_LENS, definition=PAGED_PS64)
    _, (output, lse) = _math_call(PAGED_PS64)
    blind = torch.tensor([n == 0 for row in case.visible() for n in row])
    assert blind.sum() == 3 + 3  # the first three rows of 6 over 3, all three of 3 over 0
    assert torch.equal(output[blind], torch.zeros_like(output[blind])) and torch.isneginf(lse[blind]).all()
    assert torch.isfinite(lse[~blind]).all()


def test_torch_math_prefill_takes_the_default_scale_and_no_query_rows():
    inputs = build_prefill(PrefillCase(q_lens=(4,), kv_lens=(9,), definition=RAGGED_D256), observe=False)
    q, k, v, qo_indptr, kv_indptr, _ = inputs.arguments()
    output, lse = torch_sdpa_prefill.math(q, k, v, qo_indptr, kv_indptr)
    expected = oracle_of(inputs._replace(sm_scale=1 / math.sqrt(256)))
    assert_within_bound(output, lse, expected, context="default sm_scale")
    output, lse = torch_sdpa_prefill.math(q[:0], k, v, qo_indptr[:1], kv_indptr[:1], 0.1)
    assert output.shape == (0, 8, 256) and lse.shape == (0, 8)


def test_read_prefill_call_tells_ragged_from_paged_and_names_what_is_missing():
    paged = build_prefill(PrefillCase(q_lens=(2,), kv_lens=(70,), definition=PAGED_PS64), observe=False)
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, last, scale = paged.arguments()
    call = _paged.read_prefill_call(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, last, scale)
    assert call.ragged is None and call.pages.kv_last_page_len is last and call.tokens().lengths == [70]
    with pytest.raises(ValueError, match="kv_last_page_len"):
        _paged.read_prefill_call(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, scale)
    with pytest.raises(ValueError, match="ragged keys"):
        _paged.read_prefill_call(q, k_cache[0, 0], v_cache, qo_indptr, kv_indptr)


@pytest.mark.parametrize("entry", ["math", *FUSED, "flash_as_served", "efficient_as_served"])
def test_torch_prefill_entries_declare_themselves_and_refuse_decode(entry):
    function = getattr(torch_sdpa_prefill, entry)
    served = ("empty_sequences",) if entry.endswith("_as_served") else ()
    assert function.returns_lse is True and function.waives == (*served, "input_validation")
    for definition in definitions.built_in(*definitions.PREFILL).values():
        assert function.for_definition(definition) is function
    with pytest.raises(ValueError, match="gqa_paged_decode_h32_kv4_d128_ps1: it is not a causal prefill"):
        function.for_definition(definitions.by_name("gqa_paged_decode_h32_kv4_d128_ps1"))
    odd = definitions.Definition("odd_head_dim", num_qo_heads=4, num_kv_heads=1, head_dim=100, page_size=1,
                                 op_type=definitions.PAGED_PREFILL)
    if entry == "math":
        assert function.for_definition(odd) is function
    else:
        with pytest.raises(ValueError, match="odd_head_dim: head_dim=100"):
            function.for_definition(odd)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("entry", FUSED)
def test_fused_torch_prefill_backends_refuse_cpu_tensors(entry):
    inputs = build_prefill(PrefillCase(q_lens=(2,), kv_lens=(3,), definition=PAGED_PS1), observe=False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        getattr(torch_sdpa_prefill, entry)(*inputs.arguments())


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.bfloat16, device="meta")


@pytest.mark.parametrize("backend", FUSED)
def test_fused_torch_prefill_backends_bind_to_torchs_ops_and_read_their_lse_layouts(backend):
    """On meta tensors torch runs each op's shape function, not a kernel: the adapter's arguments bind to this
    torch's schemas (the lower-right mask type included), and each op's LSE reads back as [q_len, H]."""
    output, lse = torch_sdpa_prefill._BACKENDS[backend](_meta(1, 20, 7, 128), _meta(1, 4, 30, 128),
                                                        _meta(1, 4, 30, 128), 0.1)
    assert (tuple(output.shape), tuple(lse.shape), lse.dtype) == ((1, 20, 7, 128), (7, 20), torch.float32)


def test_the_visible_mask_is_bottom_right_aligned():
    assert torch_sdpa_prefill.visible_mask(3, 4, torch.device("cpu")).tolist() == [
        [True, True, False, False], [True, True, True, False], [True, True, True, True]]
    assert not torch_sdpa_prefill.visible_mask(3, 1, torch.device("cpu"))[:2].any()


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="FlashInfer is installed here")
def test_the_flashinfer_prefill_adapter_says_what_it_needs_where_flashinfer_is_missing():
    with pytest.raises(ImportError, match=r"needs FlashInfer 0\.3\.1 and a CUDA GPU: put \.carry/flashinfer"):
        importlib.import_module("adapters.flashinfer_prefill")


def test_torch_math_prefill_passes_the_prefill_properties(tmp_path):
    """The property suite's prefill claims (decode's are deselected for a prefill definition) at the ci profile."""
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("properties", "-n", "0", "--hypothesis-profile=ci", "--max-examples=4",
                        f"--definition={PAGED_PS1}", "--impl=adapters/torch_sdpa_prefill.py:math", env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert "waives input_validation" in result.stdout, result.stdout
    assert "properties/test_prefill.py ." in result.stdout, result.stdout[-5000:]  # the prefill claims ran


@pytest.mark.parametrize("name", [PAGED_PS1, PAGED_PS64, RAGGED_D256])
def test_the_flashinfer_smoke_tests_calls_and_oracle_hold_the_math_entry(name, monkeypatch):
    """The smoke test's pieces (``_paged.example_prefill_call``, its oracle) on CPU, with the math entry standing in
    for FlashInfer (a stub module lets the adapter import)."""
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.delitem(sys.modules, "adapters.flashinfer_prefill", raising=False)
    flashinfer_prefill = importlib.import_module("adapters.flashinfer_prefill")
    definition = definitions.by_name(name)
    call = _paged.example_prefill_call(definition, [1, 7, 0, 65, 3], [1, 7, 4, 300, 130], seed=0)
    assert call[3].tolist() == [0, 1, 8, 8, 73, 76] and len(call) == len(definition.arguments)
    output, lse = torch_sdpa_prefill.math.for_definition(definition)(*call)
    assert_within_bound(output, lse, flashinfer_prefill._oracle(definition, call), context=name)
