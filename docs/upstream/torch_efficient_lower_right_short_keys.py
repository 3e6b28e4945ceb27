"""PyTorch's memory-efficient backend: ``causal_lower_right`` with more queries than keys lets rows see keys
beyond their causal window.

``torch.nn.attention.bias.causal_lower_right(q_len, kv_len)`` aligns the causal mask to the bottom right: query
row i sees keys j <= i + kv_len - q_len. When q_len > kv_len the first q_len - kv_len rows see no key; torch warns
that those rows may be NaN, and that is not what this reproducer judges. It judges the rows that do see a key:
each must be the softmax over its visible keys. The math and FlashAttention-2 backends give that. The memory-
efficient (CUTLASS) backend, which the bias dispatches to with ``custom_mask_type=2``, does not when
q_len > kv_len: its rows are the top-left (upper-left) mask's, row i seeing keys j <= i, as if the diagonal
offset kv_len - q_len were clamped at 0 (our reading of the numbers below, not of the kernel's source). So a row
that must see one key sees two, and the rows that must see none see keys too.

Input: batch 1, 8 heads, head dim 128, bf16, ``scale=None``; (q_len, kv_len) = (3, 2) (the minimal case the
suite found: rows 1 and 2 see keys 0 and 0..1), then (6, 3); (2, 1), where both alignments agree on the row
that sees a key; and (4, 4), (5, 7), where q_len <= kv_len, as controls.
Expected: float64 softmax over each row's visible keys. Reported: max |error| over the rows that see a key,
per backend, and whether the efficient backend's rows instead match the top-left (upper-left) mask.

Run (a CUDA GPU; torch 2.2 or later)::

    python torch_efficient_lower_right_short_keys.py     # exit 1 when the defect shows, 0 when not
"""

import sys
import warnings

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HEADS, DIM = 8, 128
SHAPES = ((3, 2), (6, 3), (2, 1), (4, 4), (5, 7))
BACKENDS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}


def versions() -> None:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU {torch.cuda.get_device_name()}")


def visible(q_len: int, kv_len: int, lower_right: bool = True) -> torch.Tensor:
    """[q_len, kv_len] bool: which keys each row sees."""
    offset = kv_len - q_len if lower_right else 0
    rows = torch.arange(q_len)[:, None]
    return torch.arange(kv_len)[None, :] <= rows + offset


def expected(q, k, v, mask: torch.Tensor) -> torch.Tensor:
    logits = (q.double() @ k.double().transpose(-1, -2)) / DIM**0.5
    logits = logits.masked_fill(~mask.to(q.device), float("-inf"))
    return torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v.double()


def max_error(out: torch.Tensor, reference: torch.Tensor, rows: torch.Tensor) -> float:
    return (out[:, :, rows].double() - reference[:, :, rows]).abs().nan_to_num(float("inf")).max().item()


def main() -> int:
    versions()
    g = torch.Generator().manual_seed(0)
    wrong = 0
    print(f"batch 1, {HEADS} heads, D={DIM}, bf16; max |error| over the rows that see a key")
    for q_len, kv_len in SHAPES:
        q = torch.randn(1, HEADS, q_len, DIM, generator=g).to(torch.bfloat16).cuda()
        k = torch.randn(1, HEADS, kv_len, DIM, generator=g).to(torch.bfloat16).cuda()
        v = torch.randn(1, HEADS, kv_len, DIM, generator=g).to(torch.bfloat16).cuda()
        mask = visible(q_len, kv_len)
        seeing = mask.any(dim=1)
        reference, top_left = expected(q, k, v, mask), expected(q, k, v, visible(q_len, kv_len, lower_right=False))
        line = [f"q_len {q_len}, kv_len {kv_len} (rows seeing a key: {seeing.nonzero().flatten().tolist()}):"]
        for name, backend in BACKENDS.items():
            with warnings.catch_warnings(), sdpa_kernel(backend):
                warnings.simplefilter("ignore", UserWarning)  # torch's warning about the rows that see no key
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, kv_len))
            error = max_error(out, reference, seeing)
            bad = error > 2e-2
            wrong += bad and name == "efficient"
            note = f" (top-left mask: {max_error(out, top_left, seeing):.3g})" if bad else ""
            line.append(f"{name} {error:.3g}{' WRONG' if bad else ''}{note}")
        print(" ".join(line))
    print(f"DEFECT: the efficient backend's lower-right mask is wrong on {wrong} of {len(SHAPES)} shapes" if wrong
          else "not shown")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

# ---- H200 output ----------------------------------------------------------------------------------------------
# 2026-12-04, one NVIDIA H200 (driver image: torch 2.11, CUDA 13.0): `python3 torch_efficient_lower_right_short_keys.py`, exit status 1
#
# torch 2.11.0+cu130, CUDA 13.0, GPU NVIDIA H200
# batch 1, 8 heads, D=128, bf16; max |error| over the rows that see a key
# q_len 3, kv_len 2 (rows seeing a key: [1, 2]): math 0.00722 flash 0.00722 efficient 4.16 WRONG (top-left mask: 0.00757)
# q_len 6, kv_len 3 (rows seeing a key: [3, 4, 5]): math 0.0076 flash 0.0086 efficient 3.8 WRONG (top-left mask: 0.0086)
# q_len 2, kv_len 1 (rows seeing a key: [1]): math 0 flash 0 efficient 0
# q_len 4, kv_len 4 (rows seeing a key: [0, 1, 2, 3]): math 0.00726 flash 0.00897 efficient 0.00897
# q_len 5, kv_len 7 (rows seeing a key: [0, 1, 2, 3, 4]): math 0.00777 flash 0.00777 efficient 0.00777
# DEFECT: the efficient backend's lower-right mask is wrong on 2 of 5 shapes
