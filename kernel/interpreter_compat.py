"""Makes Triton's CPU interpreter compute bf16 and ``tl.dot`` like the GPU does.

Three defects of the interpreter (``TRITON_INTERPRET=1``) matter to this kernel:

* ``tl.dot`` on bfloat16 operands multiplies the raw uint16 bit patterns, since
  the interpreter stores bf16 as uint16 and hands those arrays to ``np.matmul``
  (results near 1e10). Upstream: triton-lang/triton issue 11584; the fix, PR
  11585, was declined, so bf16 stays unsupported there.
* float32 -> bfloat16 conversion truncates toward zero, where the GPU rounds to
  nearest even: CPU results would carry about twice the GPU's rounding error.
* ``tl.dot`` is ``np.matmul``, and the BLAS under it may sum a row's products in
  an order that depends on the row's place in the tile (numpy 2.4's OpenBLAS
  does for 16-row tiles): equal rows then give results an ulp apart, where the
  GPU's matrix units give equal rows equal results. Query heads that share a KV
  head are rows of one tile, so the suite's equal-heads property would fail the
  kernel for the BLAS's doing. Patched: every row summed in one order.

``install()`` probes the interpreter for each defect and patches only what is
still broken, so the layer switches itself off once Triton (or numpy's BLAS) no
longer has the defect. It does nothing unless the interpreter is enabled.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = [
    "bf16_bits_to_float32", "float32_to_bf16_bits", "install", "installed_patches", "interpreter_enabled",
    "original_methods",
]

_installed: list[str] = []
_originals: dict[str, object] = {}  # InterpreterBuilder methods as Triton shipped them


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 values stored as uint16 bit patterns to float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 bit patterns, nearest-even, as the GPU's cvt.rn.bf16.f32."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x0040)
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def interpreter_enabled() -> bool:
    """Whether TRITON_INTERPRET selects Triton's CPU interpreter (as Triton reads the flag)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _bf16_handle(values: np.ndarray):
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    return TensorHandle(float32_to_bf16_bits(values), tl.bfloat16)


def _dot_multiplies_bits(builder_cls) -> bool:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    ones = np.ones((16, 16), dtype=np.float32)
    acc = TensorHandle(np.zeros((16, 16), dtype=np.float32), tl.float32)
    product = builder_cls().create_dot(_bf16_handle(ones), _bf16_handle(ones), acc, None, None)
    return not np.array_equal(product.data, np.full((16, 16), 16.0, dtype=np.float32))


def _cast_truncates(builder_cls) -> bool:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    # 1 + 2**-8 + 2**-9 lies above the midpoint of two bf16 neighbours: nearest is 1 + 2**-7.
    value = np.array([1.0 + 2.0**-8 + 2.0**-9], dtype=np.float32)
    cast = builder_cls().cast_impl(TensorHandle(value, tl.float32), tl.bfloat16)
    return int(cast.data.view(np.uint16)[0]) != int(float32_to_bf16_bits(value)[0])


def _dot_rows_differ(builder_cls) -> bool:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    rng = np.random.default_rng(0)  # the kernel's shape: 16 query heads by head dim 128, times 128 keys
    a = np.repeat(rng.standard_normal((1, 128)).astype(np.float32), 16, axis=0)
    b = rng.standard_normal((128, 128)).astype(np.float32)
    acc = TensorHandle(np.zeros((16, 128), dtype=np.float32), tl.float32)
    product = builder_cls().create_dot(TensorHandle(a, tl.float32), TensorHandle(b, tl.float32), acc, None, None)
    return not (product.data == product.data[:1]).all()


def _patch_dot(builder_cls, *, widen_bf16: bool, one_order_per_row: bool) -> None:
    import triton.language as tl

    original = _originals.setdefault("create_dot", builder_cls.create_dot)

    def widened(x):
        return type(x)(bf16_bits_to_float32(x.data), tl.float32) if widen_bf16 and x.dtype.scalar == tl.bfloat16 else x

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = widened(a), widened(b)
        if one_order_per_row and a.data.dtype == b.data.dtype == d.data.dtype == np.float32:
            # einsum's own loop, not the BLAS: the same summation order for every output element
            product = np.einsum("...ik,...kj->...ij", a.data, b.data, dtype=np.float32, optimize=False)
            return type(d)(product + d.data, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder_cls.create_dot = create_dot


def _patch_cast(builder_cls) -> None:
    import triton.language as tl

    original = _originals.setdefault("cast_impl", builder_cls.cast_impl)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return type(src)(float32_to_bf16_bits(src.data), tl.bfloat16)
        return original(self, src, dst_type)

    builder_cls.cast_impl = cast_impl


def install() -> list[str]:
    """Patch the interpreter where the probes find a defect; return what is patched.

    Idempotent. A no-op outside interpreter mode, and for each defect that the
    installed Triton no longer has.
    """
    if not interpreter_enabled() or _installed:
        return list(_installed)
    from triton.runtime.interpreter import InterpreterBuilder

    widen_bf16, one_order_per_row = _dot_multiplies_bits(InterpreterBuilder), _dot_rows_differ(InterpreterBuilder)
    if widen_bf16 or one_order_per_row:
        _patch_dot(InterpreterBuilder, widen_bf16=widen_bf16, one_order_per_row=one_order_per_row)
    _installed.extend(name for name, needed in (("bf16-dot", widen_bf16), ("dot-rows-alike", one_order_per_row))
                      if needed)
    if _cast_truncates(InterpreterBuilder):
        _patch_cast(InterpreterBuilder)
        _installed.append("bf16-round-nearest")
    return list(_installed)


def original_methods() -> dict[str, object]:
    """The unpatched InterpreterBuilder methods this layer replaced (for tests)."""
    return dict(_originals)


def installed_patches() -> list[str]:
    """The patches ``install()`` applied in this process."""
    return list(_installed)
