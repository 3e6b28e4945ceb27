"""Words for a failing call: its layout, and where its result leaves the bound.

Pure functions of the call's tensors and the oracle's ``Reference``; used by
``python -m gqa_decode_fuzz.record.repro``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gqa_decode_fuzz import reference
from gqa_decode_fuzz.reference.compare import error_ratio
from gqa_decode_fuzz.reference.oracle import token_lengths

Reference = reference.Reference

__all__ = ["describe_layout", "describe_mismatch", "ratios", "ranges", "sequence_lengths", "write_heatmap"]


def ranges(values: list[int]) -> str:
    """'0-7, 12, 20-21' for sorted distinct ints."""
    parts, start = [], None
    for index, value in enumerate(values):
        if start is None:
            start = value
        if index + 1 == len(values) or values[index + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ", ".join(parts) if parts else "none"


def sequence_lengths(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor | None, page_size: int) -> list[int]:
    """Tokens per sequence of a call (``kv_last_page_len`` None where pages hold one token)."""
    lasts = None if kv_last_page_len is None else kv_last_page_len.long().tolist()
    return token_lengths(kv_indptr.long().tolist(), lasts, page_size)


def _lengths_in_words(lengths: list[int]) -> str:
    empty = sum(1 for n in lengths if n == 0)
    shown = ", ".join(map(str, lengths)) if len(lengths) <= 12 else (
        f"{min(lengths)}..{max(lengths)}, {sum(lengths)} tokens in all")
    return f"batch of {len(lengths)} sequence(s), lengths {shown}" + (f" ({empty} empty)" if empty else "")


def _pages_in_words(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, pool: int) -> list[str]:
    pages = kv_indices.long().cpu()
    bounds = kv_indptr.long().tolist()
    referenced = torch.unique(pages)
    lines = [f"page pool of {pool} page(s): {referenced.numel()} referenced, {pool - referenced.numel()} not"]
    if pages.numel():
        owners: dict[int, set[int]] = {}
        runs = 0
        for seq, (a, b) in enumerate(zip(bounds, bounds[1:])):
            piece = pages[a:b]
            for page in torch.unique(piece).tolist():
                owners.setdefault(page, set()).add(seq)
            runs += int(piece.numel() > 1 and bool((piece[1:] - piece[:-1] == 1).all()))
        nonempty = sum(1 for a, b in zip(bounds, bounds[1:]) if b - a > 1)
        order = "consecutive page ids within each sequence" if nonempty and runs == nonempty else (
            "page ids out of order (shuffled)" if nonempty else "single-page sequences")
        shared = {page: seqs for page, seqs in owners.items() if len(seqs) > 1}
        repeated = pages.numel() - referenced.numel() - sum(len(s) - 1 for s in shared.values())
        lines.append(f"{order}; page ids {int(pages.min())}..{int(pages.max())}")
        if shared:
            groups = sorted({tuple(sorted(s)) for s in shared.values()})
            lines.append(f"{len(shared)} page(s) shared between sequences {'; '.join(map(str, groups))[:200]}")
        if repeated > 0:
            lines.append(f"{repeated} page(s) repeated within one sequence")
    return lines


def _memory_in_words(name: str, tensor: torch.Tensor) -> str:
    layout = "contiguous" if tensor.is_contiguous() else "NOT contiguous"
    return f"{name}: {list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}, strides {list(tensor.stride())}" \
           f", storage offset {tensor.storage_offset()} ({layout})"


def describe_layout(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None, kv_last_page_len=None) -> list[str]:
    """The call in words: batch and lengths, pages, sharing, scale, memory layout, offsets, non-finite values."""
    page_size = k_cache.shape[1]
    lengths = sequence_lengths(kv_indptr, kv_last_page_len, page_size)
    lines = [_lengths_in_words(lengths), *_pages_in_words(kv_indptr, kv_indices, k_cache.shape[0])]
    if kv_last_page_len is not None:
        lines.append(f"pages of {page_size} tokens; last pages hold {kv_last_page_len.tolist()[:16]} token(s)")
    lines.append(f"sm_scale {f'default (1/sqrt({q.shape[-1]}))' if sm_scale is None else repr(sm_scale)}")
    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("kv_indptr", kv_indptr),
               ("kv_indices", kv_indices), ("kv_last_page_len", kv_last_page_len)]
    for name, tensor in tensors:
        if tensor is not None:
            lines.append(_memory_in_words(name, tensor))
    if kv_indices.numel():
        furthest = k_cache.storage_offset() + int(kv_indices.long().max()) * k_cache.stride(0)
        if furthest >= 2**31:
            lines.append(f"largest K page offset {furthest:.3g} elements: past int32 (2**31)")
    pages = torch.unique(kv_indices.long()).to(k_cache.device)
    for name, tensor in (("q", q), ("referenced K", k_cache[pages]), ("referenced V", v_cache[pages])):
        finite = torch.isfinite(tensor.float())
        magnitude = float(tensor.float()[finite].abs().max()) if bool(finite.any()) else 0.0
        bad = int((~finite).sum())
        lines.append(f"{name}: max |value| {magnitude:.3g}" + (f", {bad} non-finite" if bad else ""))
    return lines


def ratios(output: torch.Tensor, lse: torch.Tensor, reference: Reference) -> tuple[torch.Tensor, torch.Tensor]:
    """err / bound for output [B, H, D] and lse [B, H], on the CPU (inf where NaN or the bound is 0)."""
    _, output_ratio = error_ratio(output, reference.output, reference.output_bound)
    _, lse_ratio = error_ratio(lse, reference.lse, reference.lse_bound)
    return output_ratio.cpu(), lse_ratio.cpu()


def _heads_in_words(heads: list[int], group: int) -> str:
    kv_heads = max(heads, default=0) // group + 1
    whole = [kv for kv in range(kv_heads) if all(h in heads for h in range(kv * group, (kv + 1) * group))]
    text = f"heads {ranges(heads)}"
    return text + (f" (all of KV head(s) {ranges(whole)})" if whole else "")


def _times(ratio: float) -> str:
    return f"{ratio:.3g}x the bound" if ratio != float("inf") else "the result must be exact here"


def _sequence_lines(seq: int, length: int, group: int, out_ratio, lse_ratio, output, lse, reference) -> list[str]:
    lines = [f"seq {seq} ({length} tokens):"]
    off = out_ratio > 1
    if bool(off.any()):
        heads = sorted(set(torch.nonzero(off)[:, 0].tolist()))
        dims = sorted(set(torch.nonzero(off)[:, 1].tolist()))
        worst = int(out_ratio.argmax())
        head, dim = divmod(worst, out_ratio.shape[1])
        lines.append(f"  output: {int(off.sum())} of {off.numel()} elements off; {_heads_in_words(heads, group)}; "
                     f"dims {ranges(dims)}")
        lines.append(
            f"    worst at head {head} dim {dim}: got {float(output[head, dim]):.6g}, expected "
            f"{float(reference.output[seq, head, dim]):.6g}, bound {float(reference.output_bound[seq, head, dim]):.3g}"
            f" ({_times(float(out_ratio[head, dim]))})"
        )
    lse_off = lse_ratio > 1
    if bool(lse_off.any()):
        head = int(lse_ratio.argmax())
        off_heads = _heads_in_words(sorted(torch.nonzero(lse_off)[:, 0].tolist()), group)
        lines.append(f"  lse: {off_heads} off; worst head {head}: got {float(lse[head]):.6g}, expected "
                     f"{float(reference.lse[seq, head]):.6g}, bound {float(reference.lse_bound[seq, head]):.3g} "
                     f"({_times(float(lse_ratio[head]))})")
    return lines


def describe_mismatch(output, lse, reference: Reference, lengths: list[int], group: int) -> tuple[list[str], bool]:
    """Per sequence (``lengths`` tokens each; ``group`` query heads per KV head): which heads and dims leave the
    bound and by how much; and whether any does."""
    output, lse = output.detach().cpu(), lse.detach().cpu()
    reference = Reference(*(t.cpu() for t in reference))
    if output.shape != reference.output.shape or lse.shape != reference.lse.shape:
        return [f"shapes: output {list(output.shape)} (expected {list(reference.output.shape)}), lse "
                f"{list(lse.shape)} (expected {list(reference.lse.shape)})"], True
    out_ratio, lse_ratio = ratios(output, lse, reference)
    lines = []
    for name, ratio in (("output", out_ratio), ("lse", lse_ratio)):
        off = int((ratio > 1).sum())
        worst = float(ratio.max()) if ratio.numel() else 0.0
        lines.append(f"{name}: {off} of {ratio.numel()} elements outside the bound"
                     f" ({100.0 * off / max(ratio.numel(), 1):.2g}%); worst err/bound {worst:.3g}")
    nan = int(torch.isnan(output.float()).sum()) + int(torch.isnan(lse).sum())
    if nan:
        lines.append(f"{nan} NaN value(s) in the result")
    bad_sequences = [s for s in range(out_ratio.shape[0]) if bool((out_ratio[s] > 1).any() | (lse_ratio[s] > 1).any())]
    for seq in bad_sequences:
        lines += _sequence_lines(seq, lengths[seq], group, out_ratio[seq], lse_ratio[seq], output[seq], lse[seq],
                                 reference)
    if bad_sequences:
        good = [s for s in range(out_ratio.shape[0]) if s not in bad_sequences]
        lines.append(f"sequences within bound: {ranges(good)}")
    return lines, bool(bad_sequences)


def write_heatmap(path: Path, out_ratio: torch.Tensor, lse_ratio: torch.Tensor, title: str) -> Path:
    """PNG of log10(err/bound): output as (seq, head) rows by dim, lse as seq by head; 0 is the bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def shown(ratio: torch.Tensor) -> torch.Tensor:
        return torch.log10(ratio.double().clamp(min=1e-4)).clamp(max=4.0).nan_to_num(4.0)

    batch, heads, dim = out_ratio.shape
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, max(4.0, min(0.25 * batch * 4, 24.0))),
                                         gridspec_kw={"width_ratios": [4, 1]})
    options = {"cmap": "RdYlBu_r", "vmin": -4.0, "vmax": 4.0, "aspect": "auto", "interpolation": "nearest"}
    image = left.imshow(shown(out_ratio.reshape(batch * heads, dim)).numpy(), **options)
    left.set_title("output: log10(err / bound)")
    left.set_xlabel("dim")
    left.set_yticks([s * heads for s in range(batch)], [f"seq {s}" for s in range(batch)])
    for s in range(1, batch):
        left.axhline(s * heads - 0.5, color="black", linewidth=0.5)
    right.imshow(shown(lse_ratio).numpy(), **options)
    right.set_title("lse: log10(err / bound)")
    right.set_xlabel("head")
    right.set_ylabel("seq")
    right.set_yticks(range(batch))
    figure.colorbar(image, ax=[left, right], shrink=0.8, label="log10(err/bound); > 0 is outside")
    figure.suptitle(title[:150])
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path

