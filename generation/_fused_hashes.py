"""The builder's hot draws as single Triton kernels: the same bits as the torch path in ``cases``.

On a GPU the torch path costs a launch per elementwise step (about twenty per draw), which
made the counter-based builder slower than the device RNG it replaced. These kernels do
each draw in one launch with the very same int32 steps (wrapping adds and multiplies,
masked shifts) and the same exactly rounded conversions, so ``tests/test_builder.py``
holds them to the torch path bit for bit: in Triton's interpreter on the CPU, and on CUDA.
``cases`` uses them for CUDA tensors only; the CPU keeps the torch path, which is faster
there than the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024

__all__ = ["fill_noise", "hashes", "normals"]


@triton.jit
def _mix(x):
    """``cases._mix_`` on int32 lanes: wrapping multiplies, masked (so arithmetic = logical) shifts."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x7FEB352D
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * 0x5BD1E995
    return x ^ ((x >> 16) & 0xFFFF)


@triton.jit
def _two_fields(hashes):
    """``cases._two_fields``: the two 16-bit halves of each hash summed, in [0, 131070]."""
    return (hashes & 0xFFFF) + ((hashes >> 16) & 0xFFFF)


@triton.jit
def _hashes_kernel(out_ptr, base, count, BLOCK: tl.constexpr):
    """out[i] = h(base + i), int32 bits: ``cases._hashes``."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, _mix(offsets + base), mask=offsets < count)


@triton.jit
def _normals_kernel(out_ptr, base, count, scale: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = (fields(h(base + i)) + fields(h(base + count + i)) - 2 * 0xFFFF) * scale, float32."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < count
    first = _mix(offsets + base)  # int32 lanes: the counter wraps modulo 2**32, as the torch path's add_
    second = _mix(offsets + base + count)
    ints = _two_fields(first) + _two_fields(second) - 2 * 0xFFFF  # |ints| < 2**24: exact in float32
    tl.store(out_ptr + offsets, ints.to(tl.float32) * scale, mask=inside)


@triton.jit
def _noise_kernel(out_ptr, base, count, scale: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = bf16(float32((fields(h(base + i)) - 0xFFFF) * scale)): one float32 rounding, then bf16's."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ints = _two_fields(_mix(offsets + base)) - 0xFFFF
    value = (ints.to(tl.float32) * scale).to(tl.float32)  # rounded to float32 before bf16: no double-width step
    tl.store(out_ptr + offsets, value.to(tl.bfloat16), mask=offsets < count)


def _launch(kernel, out: torch.Tensor, base: int, *scale: float) -> None:
    count = out.numel()
    if count:
        kernel[(triton.cdiv(count, _BLOCK),)](out, base, count, *scale, BLOCK=_BLOCK)


def hashes(out: torch.Tensor, base: int) -> None:
    """Fill the contiguous int32 ``out`` as ``cases._hashes`` does; ``base`` is the int32 first counter."""
    _launch(_hashes_kernel, out, base)


def normals(out: torch.Tensor, base: int, scale: float) -> None:
    """Fill the contiguous float32 ``out`` as ``cases._Stream.normals`` does; ``base`` is the int32 first counter."""
    _launch(_normals_kernel, out, base, scale)


def fill_noise(out: torch.Tensor, base: int, scale: float) -> None:
    """Fill the contiguous bf16 ``out`` as one pass of ``cases._fill_noise``; ``base`` is the int32 first counter."""
    _launch(_noise_kernel, out, base, scale)
