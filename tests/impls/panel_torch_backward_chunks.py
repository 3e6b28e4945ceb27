"""Panel implementation: plain torch, tokens last to first in chunks of 16, P rounded to bf16.

Traits, each deliberately unlike the project's kernel:
- no Triton: CPU tensors (with or without the interpreter) and CUDA tensors alike;
- one sequence at a time, its tokens reversed, an online softmax over chunks of 16 tokens
  (the smallest block the contract's error model allows), natural exp; with pages of several
  tokens the chunks run across page boundaries;
- the q.K dot product of query head h is summed in a head-dependent order (both operands
  rotated by h along the head dimension), as a kernel whose reduction order follows memory
  alignment would: two heads with the same query may differ in the last bit;
- P rounded to bf16 before P.V, the normaliser summed from unrounded P;
- validation raises TypeError for every refusal and describes arguments by position.

It serves every definition of the family (``run.for_definition``): every constant comes from
the definition; with pages of several tokens the 6th argument is ``kv_last_page_len``.

Independent of kernel/, reference/ and properties/: only torch.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

CHUNK = 16
ONE_OVER_LN2 = 1.0 / math.log(2.0)
FLOAT32_MAX = 3.4028234663852886e38
WHAT = ("1st (queries)", "2nd (key pages)", "3rd (value pages)", "4th (sequence offsets)", "5th (page ids)",
        "6th (last-page lengths)")


@dataclass(frozen=True)
class Geometry:
    """One definition's constants: query heads, KV heads, head dim, tokens per page."""

    qh: int
    kvh: int
    dh: int
    page: int


def _no(reason: str):
    raise TypeError(f"decode call refused: {reason}")


def _screen_scale(sm_scale, dh: int) -> float:
    if sm_scale is None:
        return dh**-0.5
    if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
        sm_scale = sm_scale.item()
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        _no("the softmax scale must be a real number")
    scale = float(sm_scale)
    if not (math.isfinite(scale) and abs(scale) <= FLOAT32_MAX):
        _no(f"the softmax scale {scale} is not a finite float32")
    return scale


def _screen_tensors(geo: Geometry, args) -> None:
    for label, a in zip(WHAT, args):
        if not isinstance(a, torch.Tensor):
            _no(f"the {label} argument must be a tensor")
    for label, a in zip(WHAT[:3], args[:3]):
        if a.dtype != torch.bfloat16:
            _no(f"the {label} argument must be bfloat16, it is {a.dtype}")
    for label, a in zip(WHAT[3:], args[3:]):
        if a.dtype not in (torch.int32, torch.int64):
            _no(f"the {label} argument must be int32 or int64, it is {a.dtype}")
    q, k, v, offsets, ids = args[:5]
    if q.dim() != 3 or q.shape[1:] != (geo.qh, geo.dh):
        _no(f"the {WHAT[0]} argument has shape {tuple(q.shape)}")
    if k.dim() != 4 or k.shape[1:] != (geo.page, geo.kvh, geo.dh) or v.shape != k.shape:
        _no(f"the page pools have shapes {tuple(k.shape)} and {tuple(v.shape)}")
    if offsets.dim() != 1 or offsets.shape[0] != q.shape[0] + 1 or ids.dim() != 1:
        _no(f"the index arguments have shapes {tuple(offsets.shape)} and {tuple(ids.shape)}")
    if len(args) > 5 and args[5].shape != (q.shape[0],):
        _no(f"the {WHAT[5]} argument has shape {tuple(args[5].shape)}, not ({q.shape[0]},)")
    if len({a.device for a in args}) != 1 or q.device.type not in ("cpu", "cuda"):
        _no(f"arguments on {[str(a.device) for a in args]}; all must share one CPU or CUDA device")


def _screen(geo: Geometry, args, sm_scale) -> tuple[float, list[int]]:
    """The scale, and each sequence's offset of its first page id in the 5th argument (plus the end)."""
    _screen_tensors(geo, args)
    scale = _screen_scale(sm_scale, geo.dh)
    k, offsets, ids = args[1], args[3], args[4]
    host = offsets.to("cpu", torch.int64)
    if int(host[0]) != 0 or bool((host[1:] < host[:-1]).any()) or int(host[-1]) != ids.shape[0]:
        _no("the sequence offsets must rise from 0 to the number of page ids")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= k.shape[0]):
        _no(f"a page id falls outside the {k.shape[0]} pages")
    return scale, host.tolist()


def _token_counts(geo: Geometry, offsets: list[int], last_page_len) -> list[int]:
    pages = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    if last_page_len is None:
        return pages
    filled = last_page_len.to("cpu", torch.int64).tolist()
    for n, f in zip(pages, filled):
        if n and not 1 <= f <= geo.page:
            _no(f"the {WHAT[5]} argument says {f} tokens in a last page of {geo.page}")
    return [(n - 1) * geo.page + f if n else 0 for n, f in zip(pages, filled)]


def _decode(geo: Geometry, args, sm_scale):
    scale, offsets = _screen(geo, args, sm_scale)
    q, k_cache, v_cache, _, kv_indices = args[:5]
    tokens = _token_counts(geo, offsets, args[5] if len(args) > 5 else None)
    scale = torch.tensor(scale, dtype=torch.float32)
    device = q.device
    batch = q.shape[0]
    output = torch.zeros((batch, geo.qh, geo.dh), dtype=torch.bfloat16, device=device)
    lse = torch.full((batch, geo.qh), -math.inf, dtype=torch.float32, device=device)
    # head h reads dimension (d + h) % dh at position d
    rot = (torch.arange(geo.dh, device=device)[None, :] + torch.arange(geo.qh, device=device)[:, None]) % geo.dh
    kv_of_head = torch.arange(geo.qh, device=device) // (geo.qh // geo.kvh)
    scale = scale.to(device)
    for b in range(batch):
        if tokens[b] == 0:
            continue
        order = torch.arange(tokens[b] - 1, -1, -1, device=device)  # last token first
        pages = kv_indices[offsets[b]:offsets[b + 1]].to(torch.int64)[order // geo.page]
        slots = order % geo.page
        q_rot = torch.gather(q[b].float(), 1, rot)  # [qh, dh]
        top = torch.full((geo.qh,), -math.inf, device=device)
        total = torch.zeros(geo.qh, device=device)
        acc = torch.zeros(geo.qh, geo.dh, device=device)
        for start in range(0, tokens[b], CHUNK):
            page, slot = pages[start:start + CHUNK], slots[start:start + CHUNK]
            keys = k_cache[page, slot].float()[:, kv_of_head, :]  # [c, qh, dh]
            keys = torch.gather(keys, 2, rot[None].expand(page.numel(), -1, -1))
            logits = torch.einsum("hd,chd->hc", q_rot, keys) * scale
            new_top = torch.maximum(top, logits.amax(dim=1))
            fade = torch.where(top == -math.inf, 0.0, torch.exp(top - new_top))
            p = torch.exp(logits - new_top[:, None])
            values = v_cache[page, slot].float()[:, kv_of_head, :]  # [c, qh, dh]
            total = total * fade + p.sum(dim=1)
            acc = acc * fade[:, None] + torch.einsum("hc,chd->hd", p.to(torch.bfloat16).float(), values)
            top = new_top
        output[b] = (acc / total[:, None]).to(torch.bfloat16)
        lse[b] = top * ONE_OVER_LN2 + torch.log2(total)
    return output, lse


def geometry_entry(geo: Geometry):
    """The entry point for ``geo``: five tensors and the scale, or six with pages of several tokens."""
    if min(geo.qh, geo.kvh, geo.dh, geo.page) < 1 or geo.qh % geo.kvh:
        raise ValueError(f"cannot decode with {geo}")
    if geo.page == 1:
        def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
            return _decode(geo, (q, k_cache, v_cache, kv_indptr, kv_indices), sm_scale)
        return run

    def run_paged(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
        return _decode(geo, (q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len), sm_scale)
    return run_paged


run = geometry_entry(Geometry(qh=32, kvh=4, dh=128, page=1))  # the seed's definition
run.for_definition = lambda d: geometry_entry(Geometry(d.num_qo_heads, d.num_kv_heads, d.head_dim, d.page_size))
