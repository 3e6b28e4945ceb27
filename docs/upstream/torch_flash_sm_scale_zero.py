"""PyTorch's FlashAttention-2 backend: ``scale=0.0`` gives NaN output (and an infinite LSE).

With ``scale=0`` every logit is 0 and the softmax is uniform: the output is the mean of the V rows and the
natural-log LSE is log(number of keys). The math and memory-efficient backends return that; the
FlashAttention-2 backend returns NaN when the key length does not fill its key tile, consistent with the
masked slots of a tile (-inf) being multiplied by the scale (-inf * 0 = NaN): on the H200 the lengths that
fill their tiles (64, 128, 256) are right, the others NaN, and at 129 keys the LSE is log(128), the last tile
missing from it. Our reading of the numbers below, not of the kernel's source.

Input: batch 1, 32 heads, one query token, head dim 128, bf16, keys of length 1 (the minimal case found),
then 2, 64, 127, 128, 129 and 256 to show which lengths fail.
Expected: float64 mean of V's rows; LSE log(L).

Run (a CUDA GPU with FlashAttention-2 in torch, sm80 or later)::

    python torch_flash_sm_scale_zero.py     # exit 1 when the defect shows, 0 when not
"""

import math
import sys

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, DIM = 32, 128
LENGTHS = (1, 2, 64, 127, 128, 129, 256)


def versions() -> None:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
          f"GPU {torch.cuda.get_device_name()}")


def sdpa(backend: SDPBackend, q, k, v) -> torch.Tensor | str:
    """The backend's output, or its error's first line."""
    try:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, scale=0.0)
    except RuntimeError as error:
        return str(error).splitlines()[0][:120]


def describe(out: torch.Tensor | str, expected: torch.Tensor) -> tuple[bool, str]:
    if isinstance(out, str):
        return False, f"error: {out}"
    nans = int(out.isnan().sum())
    error = (out.double() - expected).abs().nan_to_num(math.inf).max().item()
    ok = nans == 0 and error <= 1e-2
    return ok, f"{nans:>5} NaN, max|err| {error:<8.3g}"


def main() -> int:
    versions()
    dev = "cuda"
    g = torch.Generator().manual_seed(0)
    wrong = 0
    print(f"batch 1, {HEADS} heads, 1 query token, D={DIM}, bf16, scale=0.0; keys of length L")
    for length in LENGTHS:
        q = torch.randn(1, HEADS, 1, DIM, generator=g).to(torch.bfloat16).to(dev)
        k = torch.randn(1, HEADS, length, DIM, generator=g).to(torch.bfloat16).to(dev)
        v = torch.randn(1, HEADS, length, DIM, generator=g).to(torch.bfloat16).to(dev)
        expected = v.double().mean(dim=2, keepdim=True)
        flash_ok, flash = describe(sdpa(SDPBackend.FLASH_ATTENTION, q, k, v), expected)
        math_ok, math_path = describe(sdpa(SDPBackend.MATH, q, k, v), expected)
        efficient_ok, efficient = describe(sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v), expected)
        lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=0.0)[1]
        lse_error = (lse.double() - math.log(length)).abs().nan_to_num(math.inf).max().item()
        wrong += not flash_ok
        print(f"L={length:>4}: flash {flash} {'ok' if flash_ok else 'WRONG'} | flash LSE: {lse.flatten()[0].item()} "
              f"(expected {math.log(length):.5f}, max|err| {lse_error:.3g}) | math {math_path} "
              f"{'ok' if math_ok else 'WRONG'} | efficient {efficient} {'ok' if efficient_ok else 'WRONG'}")
    print(f"DEFECT: FlashAttention-2 wrong at scale 0 for {wrong} of {len(LENGTHS)} key lengths" if wrong
          else "not shown")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

# ---- H200 output ----------------------------------------------------------------------------------------------
# 2026-12-03, one NVIDIA H200 (driver image: torch 2.11, CUDA 13.0): `python3 torch_flash_sm_scale_zero.py`, exit status 1
#
# torch 2.11.0+cu130, CUDA 13.0, cuDNN 91900, GPU NVIDIA H200
# batch 1, 32 heads, 1 query token, D=128, bf16, scale=0.0; keys of length L
# L=   1: flash  4096 NaN, max|err| inf      WRONG | flash LSE: inf (expected 0.00000, max|err| 1.8e+308) | math     0 NaN, max|err| 0        ok | efficient     0 NaN, max|err| 0        ok
# L=   2: flash  4096 NaN, max|err| inf      WRONG | flash LSE: inf (expected 0.69315, max|err| 1.8e+308) | math     0 NaN, max|err| 0.00781  ok | efficient     0 NaN, max|err| 0.00781  ok
# L=  64: flash     0 NaN, max|err| 0.000977 ok | flash LSE: 4.158883094787598 (expected 4.15888, max|err| 1.14e-08) | math     0 NaN, max|err| 0.000977 ok | efficient     0 NaN, max|err| 0.000977 ok
# L= 127: flash  4096 NaN, max|err| inf      WRONG | flash LSE: inf (expected 4.84419, max|err| 1.8e+308) | math     0 NaN, max|err| 0.000941 ok | efficient     0 NaN, max|err| 0.000941 ok
# L= 128: flash     0 NaN, max|err| 0.000943 ok | flash LSE: 4.852030277252197 (expected 4.85203, max|err| 1.33e-08) | math     0 NaN, max|err| 0.000943 ok | efficient     0 NaN, max|err| 0.000943 ok
# L= 129: flash  4096 NaN, max|err| inf      WRONG | flash LSE: 4.852030277252197 (expected 4.85981, max|err| 0.00778) | math     0 NaN, max|err| 0.000766 ok | efficient     0 NaN, max|err| 0.000766 ok
# L= 256: flash     0 NaN, max|err| 0.000482 ok | flash LSE: 5.545177459716797 (expected 5.54518, max|err| 1.52e-08) | math     0 NaN, max|err| 0.000482 ok | efficient     0 NaN, max|err| 0.000482 ok
# DEFECT: FlashAttention-2 wrong at scale 0 for 4 of 7 key lengths
