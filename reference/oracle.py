"""The float64 oracle for GQA decode over a paged KV cache.

Conventions (the contract of ``kernel.run``): q [B, 32, 128], k_cache and v_cache
[P, 1, 4, 128], kv_indptr [B + 1], kv_indices [kv_indptr[-1]]; query head h reads
KV head h // 8; the scale is rounded to float32 first, as the contract passes it;
LSE is base 2; an empty sequence gives output 0 and LSE -inf exactly.

Computed on the inputs' device, vectorized over sequences and heads: sequences are
padded to the longest one in a chunk, and chunks are cut so that the padded key
block stays under a memory budget. Only the referenced pages are gathered, so a
pool of millions of pages costs nothing extra. On a GPU each chunk is padded further,
to one of a few shapes, and replayed as a CUDA graph of that shape (``graphs``): a
few launches per example instead of about a hundred. Padding only adds masked token
slots and empty sequences, so the answers agree to float64 rounding.
"""

from __future__ import annotations

import itertools
import math
import struct
from typing import NamedTuple

import torch

from .bound import SoftmaxTerms, error_bounds, factor_columns
from .graphs import GraphCache, graphs_enabled
from .transfer import to_device

NUM_QO_HEADS = 32
NUM_KV_HEADS = 4
GROUP = NUM_QO_HEADS // NUM_KV_HEADS
HEAD_DIM = 128
DEFAULT_SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)

# Padded float64 K (or V) elements per chunk: 2**25 * 8 bytes = 256 MiB.
_CHUNK_ELEMENTS = 1 << 25
# Graph shapes: token slots 16, 24, 32, 48, ... (padding at most 1.5x), sequences a power of 2; at most
# 16 x 2048 slots (128 MiB of float64 K; on an H200 the 62 shapes of 600 default-size examples added about
# 110 MiB to what torch reserved, docs/gpu.md section 19). Larger chunks run eagerly.
_SHORTEST_SLOTS = 16
_GRAPHED_TOKENS = 16 * 2048

__all__ = ["Reference", "attend", "float32_scale"]


class Reference(NamedTuple):
    """The exact result and the error an implementation may make, all float64."""

    output: torch.Tensor  # [B, 32, 128]
    lse: torch.Tensor  # [B, 32], base 2
    output_bound: torch.Tensor  # [B, 32, 128], allowed |output - reference|
    lse_bound: torch.Tensor  # [B, 32], allowed |lse - reference|


def float32_scale(sm_scale: float | None) -> float:
    """The softmax scale as the contract passes it: float32, default 1/sqrt(128)."""
    scale = DEFAULT_SM_SCALE if sm_scale is None else float(sm_scale)
    try:
        return struct.unpack("f", struct.pack("f", scale))[0]  # nearest even, on the host: no tensor, no sync
    except OverflowError:  # beyond float32's range: infinite, as a float32 tensor rounds it
        return math.copysign(math.inf, scale)


def _chunks(lengths: list[int]) -> list[tuple[int, int]]:
    """Split sequences into [start, end) runs whose K block, padded to the run's longest sequence, fits the budget."""
    per_token = NUM_KV_HEADS * HEAD_DIM
    runs, start, longest = [], 0, 0
    for end, length in enumerate(lengths):
        longest = max(longest, length)
        if end > start and (end + 1 - start) * longest * per_token > _CHUNK_ELEMENTS:
            runs.append((start, end))
            start, longest = end, length
    runs.append((start, len(lengths)))
    return runs


def _round_up(count: int, smallest: int, *, half_steps: bool) -> int:
    """The least ``smallest * 2**k`` (or, with ``half_steps``, ``1.5 * smallest * 2**k``) at or above ``count``."""
    size = smallest
    while size < count:
        if half_steps and size * 3 // 2 >= count:
            return size * 3 // 2
        size *= 2
    return size


def _graph_shape(count: int, longest: int) -> tuple[int, int] | None:
    """The padded (sequences, token slots) a chunk replays a graph of, or None when it is too large for one."""
    shape = _round_up(count, 1, half_steps=False), _round_up(longest, _SHORTEST_SLOTS, half_steps=True)
    return shape if shape[0] * shape[1] <= _GRAPHED_TOKENS else None


class _Rows(NamedTuple):
    """A chunk's inputs in the fixed shapes the float64 computation takes (b sequences, L token slots)."""

    q: torch.Tensor  # [b, 32, 128] bfloat16
    keys: torch.Tensor  # [b, L, 4, 128] bfloat16: the page of every token slot (any referenced page past the end)
    values: torch.Tensor  # [b, L, 4, 128] bfloat16
    numbers: torch.Tensor  # [2 + 5 b] float64: the scale, |scale|, then the sequences' factors [5, b]


def _empty_rows(count: int, slots: int, device: torch.device) -> _Rows:
    bf16 = dict(dtype=torch.bfloat16, device=device)
    return _Rows(
        q=torch.empty(count, NUM_QO_HEADS, HEAD_DIM, **bf16),
        keys=torch.empty(count, slots, NUM_KV_HEADS, HEAD_DIM, **bf16),
        values=torch.empty(count, slots, NUM_KV_HEADS, HEAD_DIM, **bf16),
        numbers=torch.empty(2 + 5 * count, dtype=torch.float64, device=device),
    )


_shared_rows: dict[torch.device, _Rows] = {}


def _graph_rows(count: int, slots: int, device: torch.device) -> _Rows:
    """Input buffers of one graph shape: views of one set of buffers shared by every graph on ``device``
    (a replay reads what was filled just before it), so that the inputs cost one largest case, not one per shape."""
    if device not in _shared_rows:  # every graph shape has count <= most and count * slots <= _GRAPHED_TOKENS
        most = _GRAPHED_TOKENS // _SHORTEST_SLOTS
        _shared_rows[device] = _empty_rows(most, _SHORTEST_SLOTS, device)
    whole = _shared_rows[device]
    tokens = count * slots
    return _Rows(
        q=whole.q[:count],
        keys=whole.keys.view(-1, NUM_KV_HEADS, HEAD_DIM)[:tokens].view(count, slots, NUM_KV_HEADS, HEAD_DIM),
        values=whole.values.view(-1, NUM_KV_HEADS, HEAD_DIM)[:tokens].view(count, slots, NUM_KV_HEADS, HEAD_DIM),
        numbers=whole.numbers[:2 + 5 * count],
    )


def _fill(rows: _Rows, q, k_cache, v_cache, kv_indices, starts: list[int], lengths: list[int], scale: float) -> None:
    """Gather a chunk's rows into ``rows``; sequences beyond the chunk's are empty, their q rows left as they were.

    Token slots past a sequence's end read some referenced page: the computation masks them.
    """
    count, slots = rows.keys.shape[:2]
    device = rows.q.device
    rows.q[:len(starts)].copy_(q)
    padded_lengths = lengths + [0] * (count - len(lengths))
    numbers = [scale, abs(scale), *itertools.chain.from_iterable(factor_columns(padded_lengths))]
    rows.numbers.copy_(to_device(torch.tensor(numbers, dtype=torch.float64), device))
    if not kv_indices.numel() or not k_cache.shape[0]:  # no pages: every sequence is empty
        rows.keys.zero_()
        rows.values.zero_()
        return
    position = torch.tensor(starts + [0] * (count - len(starts)))[:, None] + torch.arange(slots)
    pages = kv_indices[to_device(position.clamp_(max=kv_indices.shape[0] - 1).view(-1), device)]
    flat = (count * slots, 1, NUM_KV_HEADS, HEAD_DIM)
    torch.index_select(k_cache, 0, pages, out=rows.keys.view(flat))
    torch.index_select(v_cache, 0, pages, out=rows.values.view(flat))


def _reference_of(rows: _Rows) -> Reference:
    """The oracle and its bound for rows of fixed shape: no host synchronisation, no shape that depends on values."""
    count, longest = rows.keys.shape[:2]
    heads = count * NUM_KV_HEADS  # the batch of every matmul: one (sequence, KV head) pair each
    scale, abs_scale = rows.numbers[0], rows.numbers[1]
    factors = rows.numbers[2:].view(5, count, 1, 1, 1)
    token = torch.arange(longest, dtype=torch.float64, device=rows.q.device)
    padding = token >= factors[0]  # [b, 1, 1, L]; factors[0] is the length
    # K as [b * g, d, L] and V as [b, g, L, d]: the operands torch.matmul would hand bmm. K keeps the rows
    # slots past the end read (junk, even NaN): they only reach masked columns.
    keys = rows.keys.permute(0, 2, 3, 1).to(torch.float64, memory_format=torch.contiguous_format)
    keys = keys.view(heads, HEAD_DIM, longest)
    values = rows.values.permute(0, 2, 1, 3).to(torch.float64, memory_format=torch.contiguous_format)
    values.masked_fill_(padding.transpose(2, 3), 0.0)
    queries = rows.q.double().view(heads, GROUP, HEAD_DIM)

    shape = (count, NUM_KV_HEADS, GROUP, longest)  # [b, g, j, L]
    logits = torch.bmm(queries, keys).view(shape).mul_(scale).masked_fill_(padding, -math.inf)
    lse_natural = torch.logsumexp(logits, dim=-1)  # -inf for empty sequences
    # exp(-inf - lse) is 0 past the end of a non-empty sequence; an empty one's NaN (-inf - -inf) is masked.
    weights = (logits - lse_natural[..., None]).exp_().masked_fill_(padding, 0.0)
    output = torch.bmm(weights.view(heads, GROUP, longest), values.view(heads, longest, HEAD_DIM))
    magnitude = torch.bmm(queries.abs(), keys.abs_()).view(shape).mul_(abs_scale).masked_fill_(padding, 0.0)

    terms = SoftmaxTerms(
        logits=logits, weights=weights, values=values.permute(0, 2, 1, 3),
        output=output.view(count, NUM_KV_HEADS, GROUP, HEAD_DIM),
        logit_magnitude=magnitude, lse_natural=lse_natural, padding=padding, factors=factors,
    )
    output_bound, lse_bound = error_bounds(terms)
    return Reference(
        output=output.view(count, NUM_QO_HEADS, HEAD_DIM),
        lse=(lse_natural / math.log(2.0)).view(count, NUM_QO_HEADS),
        output_bound=output_bound.reshape(count, NUM_QO_HEADS, HEAD_DIM),
        lse_bound=lse_bound.reshape(count, NUM_QO_HEADS),
    )


_GRAPHS: GraphCache[_Rows, Reference] = GraphCache(_reference_of)


def _attend_chunk(q, k_cache, v_cache, kv_indices, starts: list[int], lengths: list[int], scale: float) -> Reference:
    """Oracle for one run of sequences (``starts`` and ``lengths`` on the host): replayed as a CUDA graph of a
    padded shape where ``graphs_enabled`` (and the capture worked), else computed eagerly in the chunk's own shape."""
    count, longest = len(lengths), max(lengths, default=0)
    device = q.device
    shape = _graph_shape(count, longest) if graphs_enabled(device) else None
    captured = _GRAPHS.get(device, shape, lambda: _graph_rows(*shape, device)) if shape else None
    if captured is None:
        rows = _empty_rows(count, max(longest, 1), device)  # one masked slot keeps reductions non-empty
        _fill(rows, q, k_cache, v_cache, kv_indices, starts, lengths, scale)
        return _reference_of(rows)
    _fill(captured.inputs, q, k_cache, v_cache, kv_indices, starts, lengths, scale)
    return Reference(*(field[:count].clone() for field in captured.replay()))


@torch.no_grad()
def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float | None = None,
    *,
    indptr_on_host: list[int] | None = None,
) -> Reference:
    """The float64 result of the kernel's contract, with the error bound it allows.

    Takes the same arguments as ``kernel.run`` and assumes they are valid (the
    property suite only feeds it valid cases). Runs on the inputs' device.
    ``indptr_on_host``, the values the caller put in ``kv_indptr`` (a list), is used
    instead of that tensor: no read-back from the device, and a kernel that wrote into
    its kv_indptr is still held to the call it was given.
    """
    scale = float32_scale(sm_scale)
    bounds = kv_indptr.tolist() if indptr_on_host is None else list(indptr_on_host)  # the one read-back, if any
    starts, lengths = bounds[:-1], [end - start for start, end in zip(bounds, bounds[1:])]
    parts = [
        _attend_chunk(q[a:b], k_cache, v_cache, kv_indices, starts[a:b], lengths[a:b], scale)
        for a, b in _chunks(lengths)
    ]
    return parts[0] if len(parts) == 1 else Reference(*(torch.cat(field) for field in zip(*parts)))
