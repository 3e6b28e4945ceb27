"""Panel implementation: plain torch, tokens last to first in chunks of 16, P rounded to bf16.

Traits, each deliberately unlike the project's kernel:
- no Triton: CPU tensors (with or without the interpreter) and CUDA tensors alike;
- one sequence at a time, its tokens reversed, an online softmax over chunks of 16 tokens
  (the smallest block the contract's error model allows), natural exp;
- the q.K dot product of query head h is summed in a head-dependent order (both operands
  rotated by h along the head dimension), as a kernel whose reduction order follows memory
  alignment would: two heads with the same query may differ in the last bit;
- P rounded to bf16 before P.V, the normaliser summed from unrounded P;
- validation raises TypeError for every refusal and describes arguments by position.

Independent of kernel/, reference/ and properties/: only torch.
"""

from __future__ import annotations

import math
import numbers

import torch

QH = 32
KVH = 4
DH = 128
CHUNK = 16
DEFAULT_SOFTMAX_SCALE = DH**-0.5
ONE_OVER_LN2 = 1.0 / math.log(2.0)
FLOAT32_MAX = 3.4028234663852886e38


def _no(reason: str):
    raise TypeError(f"decode call refused: {reason}")


def _screen(args, sm_scale) -> float:
    what = ("1st (queries)", "2nd (key pages)", "3rd (value pages)", "4th (sequence offsets)", "5th (page ids)")
    for label, a in zip(what, args):
        if not isinstance(a, torch.Tensor):
            _no(f"the {label} argument must be a tensor")
    for label, a in zip(what[:3], args[:3]):
        if a.dtype != torch.bfloat16:
            _no(f"the {label} argument must be bfloat16, it is {a.dtype}")
    for label, a in zip(what[3:], args[3:]):
        if a.dtype not in (torch.int32, torch.int64):
            _no(f"the {label} argument must be int32 or int64, it is {a.dtype}")
    q, k, v, offsets, ids = args
    if q.dim() != 3 or q.shape[1:] != (QH, DH):
        _no(f"the {what[0]} argument has shape {tuple(q.shape)}")
    if k.dim() != 4 or k.shape[1:] != (1, KVH, DH) or v.shape != k.shape:
        _no(f"the page pools have shapes {tuple(k.shape)} and {tuple(v.shape)}")
    if offsets.dim() != 1 or offsets.shape[0] != q.shape[0] + 1 or ids.dim() != 1:
        _no(f"the index arguments have shapes {tuple(offsets.shape)} and {tuple(ids.shape)}")
    if len({a.device for a in args}) != 1 or q.device.type not in ("cpu", "cuda"):
        _no(f"arguments on {[str(a.device) for a in args]}; all must share one CPU or CUDA device")
    if sm_scale is None:
        scale = DEFAULT_SOFTMAX_SCALE
    else:
        if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
            sm_scale = sm_scale.item()
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
            _no("the softmax scale must be a real number")
        scale = float(sm_scale)
        if not (math.isfinite(scale) and abs(scale) <= FLOAT32_MAX):
            _no(f"the softmax scale {scale} is not a finite float32")
    host = offsets.to("cpu", torch.int64)
    if int(host[0]) != 0 or bool((host[1:] < host[:-1]).any()) or int(host[-1]) != ids.shape[0]:
        _no("the sequence offsets must rise from 0 to the number of page ids")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= k.shape[0]):
        _no(f"a page id falls outside the {k.shape[0]} pages")
    return scale


def _rotations(device: torch.device) -> torch.Tensor:
    """[32, 128]: head h reads dimension (d + h) % 128 at position d."""
    return (torch.arange(DH, device=device)[None, :] + torch.arange(QH, device=device)[:, None]) % DH


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    scale = torch.tensor(_screen((q, k_cache, v_cache, kv_indptr, kv_indices), sm_scale), dtype=torch.float32)
    device = q.device
    batch = q.shape[0]
    output = torch.zeros((batch, QH, DH), dtype=torch.bfloat16, device=device)
    lse = torch.full((batch, QH), -math.inf, dtype=torch.float32, device=device)
    offsets = kv_indptr.to("cpu", torch.int64).tolist()
    rot = _rotations(device)
    kv_of_head = torch.arange(QH, device=device) // (QH // KVH)
    scale = scale.to(device)
    for b in range(batch):
        pages = kv_indices[offsets[b]:offsets[b + 1]].to(torch.int64).flip(0)  # last token first
        if pages.numel() == 0:
            continue
        q_rot = torch.gather(q[b].float(), 1, rot)  # [32, 128]
        top = torch.full((QH,), -math.inf, device=device)
        total = torch.zeros(QH, device=device)
        acc = torch.zeros(QH, DH, device=device)
        for start in range(0, pages.numel(), CHUNK):
            chunk = pages[start:start + CHUNK]
            keys = k_cache[chunk, 0].float()[:, kv_of_head, :]  # [c, 32, 128]
            keys = torch.gather(keys, 2, rot[None].expand(chunk.numel(), -1, -1))
            logits = torch.einsum("hd,chd->hc", q_rot, keys) * scale
            new_top = torch.maximum(top, logits.amax(dim=1))
            fade = torch.where(top == -math.inf, 0.0, torch.exp(top - new_top))
            p = torch.exp(logits - new_top[:, None])
            values = v_cache[chunk, 0].float()[:, kv_of_head, :]  # [c, 32, 128]
            total = total * fade + p.sum(dim=1)
            acc = acc * fade[:, None] + torch.einsum("hc,chd->hd", p.to(torch.bfloat16).float(), values)
            top = new_top
        output[b] = (acc / total[:, None]).to(torch.bfloat16)
        lse[b] = top * ONE_OVER_LN2 + torch.log2(total)
    return output, lse
