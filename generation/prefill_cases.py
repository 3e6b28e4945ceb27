"""Causal prefill cases: a small frozen descriptor, and one deterministic builder of tensors from it.

A ``PrefillCase`` gives each sequence a query count and a key count; the keys are laid out as decode lays out
its sequences (``cases.DecodeCase`` over the key counts: the same page layouts, spare pages, junk, value regimes
and hashes, through the decode builder's own pieces), and the queries are the value regime's query rows, one per
query token. Ragged definitions have no pool: K and V are the keys in sequence order, ``[total_kv, H_kv, D]``.
As for decode, a descriptor rebuilds bit-identical tensors on the CPU and on any GPU.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from gqa_decode_fuzz.reference import definitions

from . import cases

__all__ = ["PrefillCase", "PrefillInputs", "build_prefill"]


@dataclass(frozen=True)
class PrefillCase:
    """Everything needed to rebuild one causal prefill call.

    q_lens, kv_lens: queries and keys per sequence (the batch is ``len(q_lens)``); query i of a sequence sees
        keys j <= i + kv_len - q_len (bottom-right aligned).
    page_layout, spare_pages, pool_fill: how the keys' pages sit in the pool and what the rest holds, as for
        decode (``cases.PAGE_LAYOUTS``, ``cases.POOL_FILLS``); ignored for ragged definitions, which have no pool.
    scale, values, seed, q_layout, kv_layout, index_layout: as for decode (``cases.DecodeCase``); ragged K and V
        are always plain, and their index tensors int32.
    definition: the name of a prefill definition; None: the active one (``cases.active_definition``).
    """

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_layout: str = "shuffled"
    spare_pages: int = 0
    pool_fill: str = "nan"
    scale: float | None = None
    values: str = "normal"
    seed: int = 0
    q_layout: str = "contiguous"
    kv_layout: str = "separate"
    index_layout: str = "int32"
    definition: str | None = None

    def __post_init__(self) -> None:
        if len(self.q_lens) != len(self.kv_lens):
            raise ValueError(f"q_lens={self.q_lens} and kv_lens={self.kv_lens} must name the same sequences")
        if any(n < 0 for n in (*self.q_lens, *self.kv_lens)):
            raise ValueError(f"q_lens={self.q_lens} and kv_lens={self.kv_lens} must not be negative")

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Keys per sequence (what the run report counts as a sequence's length)."""
        return self.kv_lens

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def shape(self) -> definitions.Definition:
        """The definition this case is built for; ValueError naming it when it is not a prefill definition."""
        definition = cases.active_definition() if self.definition is None else definitions.by_name(self.definition)
        if not definition.prefill:
            raise ValueError(f"a PrefillCase needs a prefill definition; {definition.name} is {definition.op_type}")
        return definition

    @property
    def ragged(self) -> bool:
        return self.shape.op_type == definitions.RAGGED_PREFILL

    def keys(self) -> cases.DecodeCase:
        """The keys as a decode case of the same definition: one sequence per prefill sequence, its key count."""
        return cases.DecodeCase(lengths=self.kv_lens, page_layout=self.page_layout, spare_pages=self.spare_pages,
                                pool_fill=self.pool_fill, scale=self.scale, values=self.values, seed=self.seed,
                                q_layout=self.q_layout, kv_layout=self.kv_layout, index_layout=self.index_layout,
                                definition=self.shape.name)

    def visible(self) -> list[list[int]]:
        """Per sequence, the keys each of its query rows sees (0 for a row that sees none)."""
        return [[max(0, min(i + kv - q + 1, kv)) for i in range(q)] for q, kv in zip(self.q_lens, self.kv_lens)]

    def sequence_kinds(self) -> list[str]:
        """Per sequence, which of the edges the strategy weights it is (the run report counts them): no queries, no
        keys, one query (decode), a fresh prefill (q_len = kv_len), a chunk after a prefix (q_len < kv_len), or
        more queries than keys (rows that see no key)."""
        def kind(q: int, kv: int) -> str:
            if not q or not kv:
                return "no queries" if not q else "no keys"
            if q == 1:
                return "one query"
            return "fresh (q = kv)" if q == kv else "chunk after a prefix (q < kv)" if q < kv else "q > kv"

        return [kind(q, kv) for q, kv in zip(self.q_lens, self.kv_lens)]

    def choices(self) -> dict[str, str]:
        """The drawn choices by name, as the run report counts them (coverage)."""
        pages = "ragged" if self.ragged else self.page_layout
        return {"page layout": pages, "pool fill": self.pool_fill, "values": self.values, "q layout": self.q_layout,
                "kv layout": self.kv_layout, "index layout": self.index_layout}


class PrefillInputs(NamedTuple):
    """A prefill call's arguments in the suite's one order: ``kv_indices`` None for ragged K and V (then in
    ``k_cache`` and ``v_cache``), ``kv_last_page_len`` last, None where pages hold one token (``arguments`` gives
    the definition's order)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor | None
    sm_scale: float | None
    kv_last_page_len: torch.Tensor | None = None

    @property
    def ragged(self) -> bool:
        return self.kv_indices is None

    def arguments(self) -> tuple:
        """The call in the implementation's order (``Definition.arguments``)."""
        if self.ragged:
            return (self.q, self.k_cache, self.v_cache, self.qo_indptr, self.kv_indptr, self.sm_scale)
        if self.kv_last_page_len is None:
            return tuple(self[:7])
        return (*self[:6], self.kv_last_page_len, self.sm_scale)


def build_prefill(case: PrefillCase, device: torch.device | str = "cpu", *, observe: bool = True) -> PrefillInputs:
    """Deterministically build the arguments of the prefill call ``case`` describes, on ``device``: the keys as
    the decode builder lays out the sequences of ``case.keys()``, one query row per query token. Observers and
    out-of-memory handling as ``cases.build``."""
    return cases.built_and_observed(_build, case, device, observe=observe)


def _build(case: PrefillCase, device: torch.device) -> PrefillInputs:
    keys = case.keys()
    bounds = [0, *itertools.accumulate(case.q_lens)]
    qo_indptr = cases.place_index(torch.tensor(bounds, dtype=torch.int64), case.index_layout, bounds[-1], device)
    cases.remember_on_host(qo_indptr, bounds)
    if case.ragged:
        q, k, v = cases.value_rows(case.values, case.seed, device, case.shape, case.total_q, sum(case.kv_lens))
        kv_bounds = [0, *itertools.accumulate(case.kv_lens)]
        kv_indptr = cases.place_index(torch.tensor(kv_bounds, dtype=torch.int64), case.index_layout,
                                       kv_bounds[-1], device)
        cases.remember_on_host(kv_indptr, kv_bounds)
        return PrefillInputs(q=cases.place_q(q, keys), k_cache=k.to(torch.bfloat16), v_cache=v.to(torch.bfloat16),
                             qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=None, sm_scale=case.scale)
    q, k_cache, v_cache, indices, pool_size = cases.filled_pool(keys, device, case.total_q)
    kv_indptr, kv_indices, last_page_len = cases.page_index_tensors(keys, indices, pool_size, device)
    return PrefillInputs(q=cases.place_q(q, keys), k_cache=k_cache, v_cache=v_cache, qo_indptr=qo_indptr,
                         kv_indptr=kv_indptr, kv_indices=kv_indices, sm_scale=case.scale,
                         kv_last_page_len=last_page_len)
