"""The float64 oracle for GQA decode over a paged KV cache.

Conventions (any definition of ``definitions``; the shapes are read from the tensors): q [B, H, D],
k_cache and v_cache [P, page size, H_kv, D], kv_indptr [B + 1] (pages), kv_indices [kv_indptr[-1]], and
with pages of several tokens kv_last_page_len [B]; query head h reads KV head h // (H / H_kv); the scale
is rounded to float32 first, as the contract passes it (default 1/sqrt(D)); LSE is base 2; an empty
sequence gives output 0 and LSE -inf exactly.

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

# Padded float64 K (or V) elements per chunk: 2**25 * 8 bytes = 256 MiB.
_CHUNK_ELEMENTS = 1 << 25
# Graph shapes: token slots 16, 24, 32, 48, ... (padding at most 1.5x), sequences a power of 2; at most
# 16 x 2048 slots (128 MiB of float64 K), so the graphs' buffers stay small beside torch's (docs/gpu.md section 19).
# Larger chunks run eagerly.
_SHORTEST_SLOTS = 16
_GRAPHED_TOKENS = 16 * 2048

__all__ = ["Reference", "attend", "attend_rows", "float32_scale", "token_lengths"]


class Reference(NamedTuple):
    """The exact result and the error an implementation may make, all float64."""

    output: torch.Tensor  # [B, H, D]
    lse: torch.Tensor  # [B, H], base 2
    output_bound: torch.Tensor  # [B, H, D], allowed |output - reference|
    lse_bound: torch.Tensor  # [B, H], allowed |lse - reference|


def float32_scale(sm_scale: float | None, head_dim: int = 128) -> float:
    """The softmax scale as the contract passes it: float32, default 1/sqrt(head_dim)."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    try:
        return struct.unpack("f", struct.pack("f", scale))[0]  # nearest even, on the host: no tensor, no sync
    except OverflowError:  # beyond float32's range: infinite, as a float32 tensor rounds it
        return math.copysign(math.inf, scale)


def _chunks(lengths: list[int], per_token: int) -> list[tuple[int, int]]:
    """Split sequences into [start, end) runs whose K block (``per_token`` elements a token), padded to the run's
    longest sequence, fits the budget."""
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


class _Shape(NamedTuple):
    """The call's constants, read from its tensors: query heads, KV heads, head dim, page size."""

    heads: int
    kv_heads: int
    dim: int
    page_size: int

    @classmethod
    def of(cls, q: torch.Tensor, k_cache: torch.Tensor) -> _Shape:
        return cls(q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1])


class _Rows(NamedTuple):
    """A chunk's inputs in the fixed shapes the float64 computation takes (b sequences, L token slots)."""

    q: torch.Tensor  # [b, H, D] bfloat16
    keys: torch.Tensor  # [b, L, H_kv, D] bfloat16: the K row of every token slot (any referenced row past the end)
    values: torch.Tensor  # [b, L, H_kv, D] bfloat16
    numbers: torch.Tensor  # [2 + 5 b] float64: the scale, |scale|, then the sequences' factors [5, b]


def _empty_rows(count: int, slots: int, shape: _Shape, device: torch.device) -> _Rows:
    bf16 = dict(dtype=torch.bfloat16, device=device)
    return _Rows(
        q=torch.empty(count, shape.heads, shape.dim, **bf16),
        keys=torch.empty(count, slots, shape.kv_heads, shape.dim, **bf16),
        values=torch.empty(count, slots, shape.kv_heads, shape.dim, **bf16),
        numbers=torch.empty(2 + 5 * count, dtype=torch.float64, device=device),
    )


_shared_rows: dict[tuple[torch.device, _Shape], _Rows] = {}


def _graph_rows(count: int, slots: int, shape: _Shape, device: torch.device) -> _Rows:
    """Input buffers of one graph shape: views of one set of buffers shared by every graph of ``shape`` on
    ``device`` (a replay reads what was filled just before it), so that the inputs cost one largest case, not one
    per graph shape."""
    if (device, shape) not in _shared_rows:  # every graph shape has count <= most, count * slots <= _GRAPHED_TOKENS
        most = _GRAPHED_TOKENS // _SHORTEST_SLOTS
        _shared_rows[device, shape] = _empty_rows(most, _SHORTEST_SLOTS, shape, device)
    whole = _shared_rows[device, shape]
    tokens, row = count * slots, (shape.kv_heads, shape.dim)
    return _Rows(
        q=whole.q[:count],
        keys=whole.keys.view(-1, *row)[:tokens].view(count, slots, *row),
        values=whole.values.view(-1, *row)[:tokens].view(count, slots, *row),
        numbers=whole.numbers[:2 + 5 * count],
    )


def _fill(rows: _Rows, q, k_cache, v_cache, kv_indices, starts: list[int], lengths: list[int], scale: float) -> None:
    """Gather a chunk's rows into ``rows``; sequences beyond the chunk's are empty, their q rows left as they were.

    ``starts`` are each sequence's first position in kv_indices, ``lengths`` its tokens: token t sits in slot
    t % page_size of page kv_indices[start + t // page_size]. Token slots past a sequence's end read some
    referenced page: the computation masks them.
    """
    count, slots = rows.keys.shape[:2]
    device = rows.q.device
    page_size = k_cache.shape[1]
    rows.q[:len(starts)].copy_(q)
    padded_lengths = lengths + [0] * (count - len(lengths))
    numbers = [scale, abs(scale), *itertools.chain.from_iterable(factor_columns(padded_lengths))]
    rows.numbers.copy_(to_device(torch.tensor(numbers, dtype=torch.float64), device))
    if not kv_indices.numel() or not k_cache.shape[0]:  # no pages: every sequence is empty
        rows.keys.zero_()
        rows.values.zero_()
        return
    token = torch.arange(slots)
    position = torch.tensor(starts + [0] * (count - len(starts)), dtype=torch.int64)[:, None] + token // page_size
    pages = kv_indices[to_device(position.clamp_(max=kv_indices.shape[0] - 1).view(-1), device)]
    flat = (count * slots, *rows.keys.shape[2:])
    if page_size == 1:  # straight into the buffers, no temporary
        torch.index_select(k_cache, 0, pages, out=rows.keys.view(flat[0], 1, *flat[1:]))
        torch.index_select(v_cache, 0, pages, out=rows.values.view(flat[0], 1, *flat[1:]))
        return
    within = to_device((token % page_size).repeat(count), device)
    rows.keys.view(flat).copy_(k_cache[pages.long(), within])
    rows.values.view(flat).copy_(v_cache[pages.long(), within])


def _reference_of(rows: _Rows) -> Reference:
    """The oracle and its bound for rows of fixed shape: no host synchronisation, no shape that depends on values."""
    count, longest, kv_heads, dim = rows.keys.shape
    query_heads = rows.q.shape[1]
    group = query_heads // kv_heads
    heads = count * kv_heads  # the batch of every matmul: one (sequence, KV head) pair each
    scale, abs_scale = rows.numbers[0], rows.numbers[1]
    factors = rows.numbers[2:].view(5, count, 1, 1, 1)
    token = torch.arange(longest, dtype=torch.float64, device=rows.q.device)
    padding = token >= factors[0]  # [b, 1, 1, L]; factors[0] is the length
    # K as [b * g, d, L] and V as [b, g, L, d]: the operands torch.matmul would hand bmm. K keeps the rows
    # slots past the end read (junk, even NaN): they only reach masked columns.
    keys = rows.keys.permute(0, 2, 3, 1).to(torch.float64, memory_format=torch.contiguous_format)
    keys = keys.view(heads, dim, longest)
    values = rows.values.permute(0, 2, 1, 3).to(torch.float64, memory_format=torch.contiguous_format)
    values.masked_fill_(padding.transpose(2, 3), 0.0)
    queries = rows.q.double().view(heads, group, dim)

    shape = (count, kv_heads, group, longest)  # [b, g, j, L]
    logits = torch.bmm(queries, keys).view(shape).mul_(scale).masked_fill_(padding, -math.inf)
    lse_natural = torch.logsumexp(logits, dim=-1)  # -inf for empty sequences
    # exp(-inf - lse) is 0 past the end of a non-empty sequence; an empty one's NaN (-inf - -inf) is masked.
    weights = (logits - lse_natural[..., None]).exp_().masked_fill_(padding, 0.0)
    output = torch.bmm(weights.view(heads, group, longest), values.view(heads, longest, dim))
    magnitude = torch.bmm(queries.abs(), keys.abs_()).view(shape).mul_(abs_scale).masked_fill_(padding, 0.0)

    terms = SoftmaxTerms(
        logits=logits, weights=weights, values=values.permute(0, 2, 1, 3),
        output=output.view(count, kv_heads, group, dim),
        logit_magnitude=magnitude, lse_natural=lse_natural, padding=padding, factors=factors,
    )
    output_bound, lse_bound = error_bounds(terms)
    return Reference(
        output=output.view(count, query_heads, dim),
        lse=(lse_natural / math.log(2.0)).view(count, query_heads),
        output_bound=output_bound.reshape(count, query_heads, dim),
        lse_bound=lse_bound.reshape(count, query_heads),
    )


_GRAPHS: GraphCache[_Rows, Reference] = GraphCache(_reference_of)


def _attend_chunk(q, k_cache, v_cache, kv_indices, starts: list[int], lengths: list[int], scale: float) -> Reference:
    """Oracle for one run of sequences (``starts`` and ``lengths`` on the host): replayed as a CUDA graph of a
    padded shape where ``graphs_enabled`` (and the capture worked), else computed eagerly in the chunk's own shape."""
    count, longest = len(lengths), max(lengths, default=0)
    device, constants = q.device, _Shape.of(q, k_cache)
    shape = _graph_shape(count, longest) if graphs_enabled(device) else None
    captured = None
    if shape:
        captured = _GRAPHS.get(device, (*shape, *constants), lambda: _graph_rows(*shape, constants, device))
    if captured is None:
        rows = _empty_rows(count, max(longest, 1), constants, device)  # one masked slot keeps reductions non-empty
        _fill(rows, q, k_cache, v_cache, kv_indices, starts, lengths, scale)
        return _reference_of(rows)
    _fill(captured.inputs, q, k_cache, v_cache, kv_indices, starts, lengths, scale)
    return Reference(*(field[:count].clone() for field in captured.replay()))


def token_lengths(bounds: list[int], last_page_len: list[int] | None, page_size: int) -> list[int]:
    """Tokens per sequence from kv_indptr's values (pages) and kv_last_page_len's: (pages - 1) * page_size + last,
    0 for a sequence without pages."""
    pages = [end - start for start, end in zip(bounds, bounds[1:])]
    if last_page_len is None:
        if page_size != 1:
            raise ValueError(f"pages of {page_size} tokens need kv_last_page_len")
        return pages
    return [(n - 1) * page_size + last if n else 0 for n, last in zip(pages, last_page_len)]


@torch.no_grad()
def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float | None = None,
    kv_last_page_len: torch.Tensor | None = None,
    *,
    indptr_on_host: list[int] | None = None,
    last_page_len_on_host: list[int] | None = None,
) -> Reference:
    """The float64 result of the contract, with the error bound it allows.

    Takes a call's arguments in the suite's order (``kv_last_page_len`` last: None where pages hold one token)
    and assumes they are valid (the property suite only feeds it valid cases). Runs on the inputs' device.
    ``indptr_on_host`` and ``last_page_len_on_host``, the values the caller put in those tensors (lists), are
    used instead of them: no read-back from the device, and a kernel that wrote into its inputs is still held to
    the call it was given.
    """
    scale = float32_scale(sm_scale, q.shape[2])
    bounds = kv_indptr.tolist() if indptr_on_host is None else list(indptr_on_host)  # the one read-back, if any
    lasts = last_page_len_on_host
    if lasts is None and kv_last_page_len is not None:
        lasts = kv_last_page_len.tolist()
    return attend_rows(q, k_cache, v_cache, kv_indices, bounds[:-1], token_lengths(bounds, lasts, k_cache.shape[1]),
                       scale)


def attend_rows(q, k_cache, v_cache, kv_indices, starts: list[int], lengths: list[int], scale: float) -> Reference:
    """The oracle and its bound for query rows ``q`` [R, H, D], row r over the first ``lengths[r]`` tokens of the
    pages ``kv_indices[starts[r]:]`` (``scale`` already float32): ``attend``'s computation, the rows grouped by
    length (``_length_groups``) and in chunks that fit the memory budget. Each row is one decode; causal prefill
    (``prefill_oracle``) hands it a row per query."""
    parts, order = [], []
    for group in _length_groups(lengths, graphs_enabled(q.device)):
        group_q = _rows_of(q, group)
        group_starts, group_lengths = [starts[r] for r in group], [lengths[r] for r in group]
        for a, b in _chunks(group_lengths, k_cache.shape[2] * q.shape[2]):
            parts.append(_attend_chunk(group_q[a:b], k_cache, v_cache, kv_indices, group_starts[a:b],
                                       group_lengths[a:b], scale))
        order += group
    joined = parts[0] if len(parts) == 1 else Reference(*(torch.cat(field) for field in zip(*parts)))
    if order == sorted(order):
        return joined
    back = to_device(torch.tensor(order).argsort(), q.device)  # each row's place in the grouped order
    return Reference(*(field.index_select(0, back) for field in joined))


# A group of rows costs the oracle about as much device time as this many more padded token slots would (a graph
# replay's few dozen small kernels): benchmarks/oracle_groups.py measures the trade.
_GROUP_COST_SLOTS = 4096


def _padded_slots(count: int, longest: int, graphed: bool) -> int:
    """Token slots the oracle computes for ``count`` rows padded to the longest (and, graphed, to a graph's shape)."""
    shape = _graph_shape(count, longest) if graphed else None
    return shape[0] * shape[1] if shape else count * max(longest, 1)


def _length_groups(lengths: list[int], graphed: bool) -> list[list[int]]:
    """The rows in groups computed apart, each padded to its own longest row: longest rows first, cut where the
    padding saved outweighs another group's cost (``_GROUP_COST_SLOTS``). A ragged batch padded whole to its
    longest sequence computes several times its tokens; one group, in the rows' order, where cutting saves nothing.

    Cuts fall only where a row's padded length changes, 1.5x steps as graphs pad (between them a cut saves little),
    so the search is over a few dozen positions however many rows there are."""
    if len(lengths) < 2:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    width = [_round_up(lengths[row], _SHORTEST_SLOTS, half_steps=True) for row in order]  # as a graph pads a row
    cuts = [0, *[i for i in range(1, len(order)) if width[i] != width[i - 1]], len(order)]
    cost, previous = [0] + [math.inf] * (len(cuts) - 1), [0] * len(cuts)
    for i in range(1, len(cuts)):
        for j in range(i):
            spent = cost[j] + _GROUP_COST_SLOTS + _padded_slots(cuts[i] - cuts[j], lengths[order[cuts[j]]], graphed)
            if spent < cost[i]:
                cost[i], previous[i] = spent, j
    bounds, i = [], len(cuts) - 1
    while i:
        bounds.append((cuts[previous[i]], cuts[i]))
        i = previous[i]
    if len(bounds) <= 1:
        return [list(range(len(lengths)))]
    return [order[a:b] for a, b in reversed(bounds)]


def _rows_of(q: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``q[rows]``: a view where the rows run in order, else gathered on q's device."""
    first = rows[0] if rows else 0
    if rows == list(range(first, first + len(rows))):
        return q[first:first + len(rows)]
    return q.index_select(0, to_device(torch.tensor(rows), q.device))
