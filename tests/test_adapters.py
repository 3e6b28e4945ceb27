"""adapters/: production kernels under this contract, on CPU (CI installs ``sglang --no-deps``).

SGLang's decode kernel takes seconds per example in the interpreter, so CI runs a few
examples of the central properties; the H200 run in docs/findings.md runs them all.
PyTorch's math attention (adapters/torch_sdpa.py) runs on CPU as it is: checked against
every built-in definition's own float32 reference, and its argument handling for both
argument orders. Its fused siblings need CUDA: here only their refusal on CPU is checked.
"""

import importlib.util
import math

import pytest
import torch

from adapters import _paged, torch_sdpa
from gqa_decode_fuzz.reference import definitions
from tests.pytest_runs import clean_environment, run_pytest

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                  reason="the sglang wheel is not installed (pip install --no-deps sglang)")


def _suite(tmp_path, *args: str):
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    return run_pytest("-n", "0", "--hypothesis-profile=ci", "--max-examples=6", *args, env=env, timeout=2400)


@needs_sglang
@pytest.mark.parametrize("definition", ["gqa_paged_decode_h32_kv4_d128_ps1", "gqa_paged_decode_h32_kv4_d128_ps64"])
def test_sglang_as_served_passes_the_central_properties(tmp_path, definition):
    """On the seed's definition and on 64-token pages (the adapter's token slots and ``page_size``)."""
    result = _suite(tmp_path, "properties/test_decode.py::test_output_and_lse_within_error_bound",
                    "properties/test_edge_shapes.py::test_lengths_at_block_edges_stay_within_error_bound",
                    "--impl=adapters/sglang_decode.py:run_as_served", f"--definition={definition}")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    for declared in ("no LSE: output checked alone", "knobs num_kv_splits", "waives empty_sequences"):
        assert declared in result.stdout, result.stdout


@needs_sglang
def test_sglang_gives_nan_for_an_empty_sequence(tmp_path):
    """A contract difference (docs/findings.md): SGLang's merge divides 0 by 0 for a sequence of no tokens."""
    result = _suite(tmp_path, "properties/test_edge_shapes.py::test_all_sequences_empty_give_zero_output_and_"
                    "negative_infinite_lse", "--impl=adapters/sglang_decode.py:run")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nan" in result.stdout.lower()


# ---- PyTorch's attention backends (adapters/torch_sdpa.py) ----------------------------------

@pytest.mark.parametrize("name", sorted(definitions.BUILT_IN))
def test_torch_math_matches_each_definitions_float32_reference(name):
    """Within one bf16 rounding step of the definition's float32 reference (both compute in float32 and round the
    output to bf16 once); LSE within float32 rounding; empty sequences exactly (0, -inf)."""
    definition = definitions.BUILT_IN[name]
    size = definition.page_size
    lengths = [0, 1, 5, size, size + 1, 2 * size + 3, 0, 70]
    call = _paged.example_call(definition, lengths, seed=len(name))
    output, lse = torch_sdpa.math.for_definition(definition)(*call)
    expected_output, expected_lse = _paged.reference_of(definition)(*call)
    assert output.shape == expected_output.shape and output.dtype == torch.bfloat16
    assert lse.shape == expected_lse.shape and lse.dtype == torch.float32
    torch.testing.assert_close(output.float(), expected_output.float(), rtol=2**-7, atol=1e-6)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=1e-5)
    empty = torch.tensor([n == 0 for n in lengths])
    assert torch.equal(output[empty], torch.zeros_like(output[empty]))
    assert torch.isneginf(lse[empty]).all()


def test_torch_math_takes_the_default_scale_and_an_empty_batch():
    definition = definitions.BUILT_IN["gqa_paged_decode_h32_kv4_d128_ps64"]
    q, k_cache, v_cache, indptr, ids, last, _ = _paged.example_call(definition, [3, 65], seed=1)
    output, lse = torch_sdpa.math(q, k_cache, v_cache, indptr, ids, last)
    reference = _paged.reference_of(definition)
    expected = reference(q, k_cache, v_cache, indptr, ids, last, 1 / math.sqrt(definition.head_dim))
    torch.testing.assert_close(lse, expected[1], rtol=1e-5, atol=1e-5)
    output, lse = torch_sdpa.math(q[:0], k_cache, v_cache, indptr[:1], ids[:0], last[:0], 0.1)
    assert output.shape == (0, 32, 128) and lse.shape == (0, 32)


def test_a_paged_pool_without_kv_last_page_len_is_refused():
    definition = definitions.BUILT_IN["gqa_paged_decode_h20_kv4_d128_ps64"]
    q, k_cache, v_cache, indptr, ids, _, scale = _paged.example_call(definition, [3], seed=2)
    with pytest.raises(ValueError, match="kv_last_page_len"):
        _paged.read_call(q, k_cache, v_cache, indptr, ids, scale)


@pytest.mark.parametrize("entry", ["flash", "flash_as_served", "efficient", "efficient_as_served", "cudnn",
                                   "cudnn_as_served", "math"])
def test_torch_entries_declare_themselves(entry):
    function = getattr(torch_sdpa, entry)
    assert function.returns_lse is True
    assert "input_validation" in function.waives
    assert ("empty_sequences" in function.waives) == entry.endswith("_as_served")
    for definition in definitions.BUILT_IN.values():
        assert function.for_definition(definition) is function
    odd = definitions.Definition("odd_head_dim", num_qo_heads=4, num_kv_heads=1, head_dim=100, page_size=1)
    if entry == "math":
        assert function.for_definition(odd) is function
    else:
        with pytest.raises(ValueError, match="head_dim=100"):
            function.for_definition(odd)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("entry", ["flash", "efficient", "cudnn"])
def test_fused_torch_backends_refuse_cpu_tensors(entry):
    call = _paged.example_call(definitions.SEED, [2], seed=3)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        getattr(torch_sdpa, entry)(*call)


def test_the_padded_batch_puts_each_sequence_at_position_0_and_masks_the_rest():
    """cuDNN's dense batch (not runnable on CPU): each sequence's tokens from slot 0, -inf bias past its length."""
    keys = torch.arange(6, dtype=torch.bfloat16).reshape(6, 1, 1)
    tokens = _paged.Tokens(keys, -keys, [2, 0, 4], torch.tensor([0, 2, 2, 6], dtype=torch.int32))
    padded_keys, padded_values, bias = torch_sdpa._padded(tokens, 8)
    assert padded_keys[:, :, 0, 0].tolist() == [[0, 1, 0, 0, 0, 0, 0, 0], [0] * 8, [2, 3, 4, 5, 0, 0, 0, 0]]
    assert torch.equal(padded_values, -padded_keys)
    assert torch.isneginf(bias).tolist() == [[n >= length for n in range(8)] for length in (2, 0, 4)]
    assert (bias[torch.isfinite(bias)] == 0).all()


@pytest.mark.parametrize("shape", [(32, 3), (3, 32, 1), (3, 32, 32), (3, 32, 1, 1)])
def test_backend_lse_layouts_read_as_batch_by_heads_in_base_2(shape):
    lse = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    rows = torch_sdpa._lse_rows(lse, 3, 32, "test")
    first = lse.t() if len(shape) == 2 else lse.reshape(3, 32, -1)[:, :, 0]
    torch.testing.assert_close(rows, first / math.log(2), rtol=1e-6, atol=0)
    with pytest.raises(RuntimeError, match="unexpected LSE shape"):
        torch_sdpa._lse_rows(lse, 4, 32, "test")


def _meta(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fused_torch_backends_bind_to_torchs_ops_and_read_their_lse_layouts():
    """On meta tensors torch runs each op's shape function, not a kernel: the adapter's arguments bind to this
    torch's schemas, and the LSE each op returns reads back as [B, H]."""
    batch, heads, kv_heads, dim, tokens = 3, 20, 4, 128, 50
    call = _paged.Call(_meta(batch, heads, dim), _meta(1, 1, kv_heads, dim), _meta(1, 1, kv_heads, dim),
                       _meta(batch + 1, dtype=torch.int32), _meta(tokens, dtype=torch.int32), None, 0.1)
    ragged = _paged.Tokens(_meta(tokens, kv_heads, dim), _meta(tokens, kv_heads, dim), [20, 0, 30],
                           _meta(batch + 1, dtype=torch.int32))
    results = {"flash": torch_sdpa._flash(call, ragged), "efficient": torch_sdpa._efficient(call, ragged),
               "cudnn": torch_sdpa._cudnn_padded(call, _meta(batch, 32, kv_heads, dim), _meta(batch, 32, kv_heads, dim),
                                                 _meta(batch, 32))}
    for backend, (output, lse) in results.items():
        assert (tuple(output.shape), tuple(lse.shape), lse.dtype) == ((batch, heads, dim), (batch, heads),
                                                                      torch.float32), backend


@pytest.mark.parametrize("name", ["gqa_paged_decode_h20_kv4_d128_ps1", "gqa_paged_decode_h32_kv8_d128_ps64"])
def test_torch_math_passes_the_central_properties(tmp_path, name):
    result = _suite(tmp_path, "properties/test_decode.py::test_output_and_lse_within_error_bound",
                    "properties/test_edge_shapes.py::test_lengths_at_block_edges_stay_within_error_bound",
                    "properties/test_edge_shapes.py::test_all_sequences_empty_give_zero_output_and_"
                    "negative_infinite_lse", f"--definition={name}", "--impl=adapters/torch_sdpa.py:math")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert "waives input_validation" in result.stdout, result.stdout


@needs_sglang
def test_sglang_as_served_passes_the_central_property_with_pages_of_64_tokens(tmp_path):
    """Pages of several tokens go to SGLang's kernel as token slots with its page_size (adapters/sglang_decode.py)."""
    result = _suite(tmp_path, "properties/test_decode.py::test_output_and_lse_within_error_bound",
                    "--definition=gqa_paged_decode_h20_kv4_d128_ps64", "--impl=adapters/sglang_decode.py:run_as_served")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]


def test_the_sglang_carry_is_the_kernel_files_alone(tmp_path):
    """adapters/sglang_package.py takes the listed files out of a wheel and nothing else."""
    import zipfile

    from adapters import sglang_package

    wheel = tmp_path / "sglang-0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in (*sglang_package.FILES, "sglang/srt/server.py"):
            archive.writestr(name, f"# {name}\n")
    out = tmp_path / "carry"
    assert sglang_package.build(wheel, out) > 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.py")) == sorted(sglang_package.FILES)


def test_the_sglang_carry_keeps_the_wheel_metadata_for_its_version(tmp_path):
    """The carry holds the wheel's METADATA, so importlib.metadata reports the version (docs/upstream prints it)."""
    import importlib.metadata
    import zipfile

    from adapters import sglang_package

    wheel = tmp_path / "sglang-9.8.7-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in sglang_package.FILES:
            archive.writestr(name, f"# {name}\n")
        archive.writestr("sglang-9.8.7.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 9.8.7\n")
    out = tmp_path / "carry"
    sglang_package.build(wheel, out)
    found = [d for d in importlib.metadata.distributions(path=[str(out)]) if d.metadata["Name"] == "sglang"]
    assert [d.version for d in found] == ["9.8.7"]
