"""Whether Triton keeps a masked load whose values only feed ``sum(values * 0)`` (GPU only).

The first planted one-past reader (tests/impls/reads_one_past.py) discarded its read that way and memcheck saw
nothing on the H200; this compiles that form and the current one (the sum stored) and prints how many global loads
each one's PTX holds:

    python3 benchmarks/dead_load_probe.py
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _times_zero(indptr, scratch, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    values = tl.load(indptr + offs, mask=offs <= n, other=0)
    tl.store(scratch, tl.sum(tl.where(offs < n, values, 0) * 0, axis=0))


@triton.jit
def _stored_sum(indptr, scratch, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    values = tl.load(indptr + offs, mask=offs <= n, other=0)
    tl.store(scratch, tl.sum(values, axis=0))


def main() -> None:
    indptr = torch.arange(5, dtype=torch.int32, device="cuda")
    scratch = torch.empty(1, dtype=torch.int32, device="cuda")
    print(f"{'form':>12}{'ld.global in PTX':>18}")
    for name, kernel in (("times zero", _times_zero), ("stored sum", _stored_sum)):
        compiled = kernel[(1,)](indptr, scratch, indptr.numel(), BLOCK=8)
        print(f"{name:>12}{compiled.asm['ptx'].count('ld.global'):>18}")


if __name__ == "__main__":
    main()
