"""The interpreter's bf16 and tl.dot defects, the compatibility layer's fix, and its self-switch-off."""

import os

import numpy as np
import pytest
import torch

from gqa_decode_fuzz.kernel import interpreter_compat as compat

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="concerns Triton's CPU interpreter only"
)


@pytest.fixture
def unpatched_builder(monkeypatch):
    """The interpreter's builder with the layer's patches undone for this test."""
    from triton.runtime.interpreter import InterpreterBuilder

    for name, original in compat.original_methods().items():
        monkeypatch.setattr(InterpreterBuilder, name, original)
    return InterpreterBuilder


def _bf16_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Run a bf16 tl.dot through the interpreter (kernel defined here, after the flag is set)."""
    import triton
    import triton.language as tl

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        a = tl.load(a_ptr + offs[:, None] * N + offs[None, :])
        b = tl.load(b_ptr + offs[:, None] * N + offs[None, :])
        tl.store(c_ptr + offs[:, None] * N + offs[None, :], tl.dot(a, b))

    c = torch.empty(a.shape, dtype=torch.float32)
    dot_kernel[(1,)](a, b, c, N=a.shape[0])
    return c


def _operands():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(16, 16, generator=gen).bfloat16(), torch.randn(16, 16, generator=gen).bfloat16())


def test_layer_is_installed_while_triton_has_the_defects(unpatched_builder):
    # Whether the BLAS under np.matmul sums equal rows alike depends on numpy's build: patched where it does not.
    rows_differ = compat._dot_rows_differ(unpatched_builder)
    always = {"bf16-dot", "bf16-round-nearest"}
    assert set(compat.installed_patches()) == (always | {"dot-rows-alike"} if rows_differ else always)


def test_equal_rows_of_a_dot_give_equal_results():
    """Query heads of one KV group are rows of one tile: equal queries, equal results, as on the GPU."""
    import triton
    import triton.language as tl

    @triton.jit
    def rows_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
        rows, inner, cols = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
        a = tl.load(a_ptr + rows[:, None] * K + inner[None, :])
        b = tl.load(b_ptr + inner[:, None] * N + cols[None, :])
        tl.store(c_ptr + rows[:, None] * N + cols[None, :], tl.dot(a, b))

    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(1, 128, generator=gen).to(dtype).repeat(16, 1)
        b = torch.randn(128, 64, generator=gen).to(dtype)
        c = torch.empty(16, 64)
        rows_kernel[(1,)](a, b, c, M=16, K=128, N=64)
        assert (c == c[:1]).all(), dtype
        torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


def test_unpatched_interpreter_multiplies_bf16_bit_patterns(unpatched_builder):
    a, b = _operands()
    wrong = _bf16_dot(a, b)
    assert wrong.abs().max() > 1e6  # products of raw uint16 patterns


def test_patched_interpreter_gives_the_float32_product():
    a, b = _operands()
    torch.testing.assert_close(_bf16_dot(a, b), a.float() @ b.float(), rtol=1e-6, atol=1e-5)


def test_float32_to_bf16_rounds_to_nearest_even_like_torch():
    values = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    expected = torch.from_numpy(values).bfloat16().view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(compat.float32_to_bf16_bits(values), expected)


def test_unpatched_interpreter_truncates_float32_to_bf16(unpatched_builder):
    assert compat._cast_truncates(unpatched_builder)


def test_layer_switches_itself_off_once_triton_is_fixed(monkeypatch):
    monkeypatch.setattr(compat, "_installed", [])
    monkeypatch.setattr(compat, "_dot_multiplies_bits", lambda builder: False)
    monkeypatch.setattr(compat, "_cast_truncates", lambda builder: False)
    monkeypatch.setattr(compat, "_dot_rows_differ", lambda builder: False)
    assert compat.install() == []
