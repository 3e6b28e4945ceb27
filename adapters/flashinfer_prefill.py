"""FlashInfer's causal batch prefill (paged and ragged wrappers, plan + run) under this suite's contract.

Use (GPU only; FlashInfer compiles its kernels with nvcc on first use)::

    python adapters/flashinfer_package.py            # here: builds .carry/flashinfer (docs/gpu.md)
    PYTHONPATH=.carry/flashinfer python -m adapters.flashinfer_prefill     # there: compile + smoke test
    PYTHONPATH=.carry/flashinfer pytest properties --definition=prefill --impl=adapters/flashinfer_prefill.py:run

Written against flashinfer-python 0.3.1 (the trimmed package ``flashinfer_package.py`` builds; flashinfer/prefill.py).

What is called
    Paged definitions: ``BatchPrefillWithPagedKVCacheWrapper``; ragged: ``BatchPrefillWithRaggedKVCacheWrapper``.
    One wrapper per device, kind and backend, NHD layout, over a 128 MiB zeroed workspace (FlashInfer's examples'
    size), kept for the process as an engine keeps it. Each call plans for its batch, ``causal=True``,
    ``pos_encoding_mode="NONE"``, bf16 ``q_data_type`` and ``kv_data_type``, the call's ``sm_scale``: paged
    ``plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, ...)``
    then ``run(q, (k_cache, v_cache), return_lse=True)``; ragged ``plan(qo_indptr, kv_indptr, num_qo_heads,
    num_kv_heads, head_dim, ...)`` then ``run(q, k, v, return_lse=True)``. Page size 1 has no ``kv_last_page_len``
    in the contract: the adapter passes 1 for each sequence with a page and 0 for an empty one, as an engine fills
    it. Index tensors go as int32 (the compiled module is specialised on the index type; engines pass int32).

    FlashInfer's causal mask is bottom-right aligned, as the contract's (include/flashinfer/attention/prefill.cuh
    masks key ``kv_idx`` of query ``q_idx`` where ``kv_idx + qo_len > kv_len + q_idx``), and its LSE is base 2
    (``log2(d) + m`` with the logits scaled by ``sm_scale * log2 e``): both are returned as they are.

backend
    ``backend="fa2"``, FlashInfer's FlashAttention-2 templates, on every GPU: the sources the carry already holds
    for the decode wrapper's tensor-core path. FlashInfer's own choice (``"auto"``) on an sm90 GPU is ``"fa3"``,
    whose sm90 sources and CUTLASS headers the carry leaves out (``flashinfer_package.py``).

Declarations
    ``run``: the whole contract except input validation (FlashInfer checks shapes, not page ids or the indptrs).
    Rows that see no key (more queries than keys, or none) go to the kernel and its answer is reported. A call of
    no query rows is answered by the adapter (empty tensors) without calling FlashInfer, as by the torch adapters.
    ``run_as_served`` also waives ``empty_sequences``: rows that see no key (an engine never reads them) are read as
    the contract's (0, -inf) and every other row is checked in full.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

try:
    import flashinfer
except ImportError as error:  # a CPU machine, or the carry not on PYTHONPATH
    raise ImportError("adapters/flashinfer_prefill.py needs FlashInfer 0.3.1 and a CUDA GPU: put .carry/flashinfer "
                      "(built by adapters/flashinfer_package.py) on PYTHONPATH, or install flashinfer-python"
                      ) from error

from adapters._paged import PrefillCall, empty_result, last_page_lengths, read_prefill_call, unit_last_stride

__all__ = ["run", "run_as_served"]

_WORKSPACE_BYTES = 128 * 2**20
_HEAD_DIMS = (64, 128, 256)  # the head dims FlashInfer's prefill is built and tested for
_wrappers: dict[tuple[str, str, str], object] = {}


def _wrapper(device: torch.device, ragged: bool, backend: str):
    key = (str(device), "ragged" if ragged else "paged", backend)
    if key not in _wrappers:
        workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        kind = (flashinfer.BatchPrefillWithRaggedKVCacheWrapper if ragged
                else flashinfer.BatchPrefillWithPagedKVCacheWrapper)
        _wrappers[key] = kind(workspace, kv_layout="NHD", backend=backend)
    return _wrappers[key]


def _int32(index: torch.Tensor) -> torch.Tensor:
    return index.to(torch.int32).contiguous()


def _prefill(call: PrefillCall, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if call.q.shape[0] == 0:
        return empty_result(call)
    heads, dim = call.q.shape[1:]
    q = unit_last_stride(call.q)
    planned = dict(causal=True, pos_encoding_mode="NONE", sm_scale=call.sm_scale, q_data_type=call.q.dtype)
    if call.pages is None:
        keys = call.ragged
        wrapper = _wrapper(q.device, True, backend)
        wrapper.plan(_int32(call.qo_indptr), _int32(keys.cu_seqlens), heads, keys.keys.shape[1], dim,
                     kv_data_type=keys.keys.dtype, **planned)
        return wrapper.run(q, unit_last_stride(keys.keys), unit_last_stride(keys.values), return_lse=True)
    pages = call.pages
    wrapper = _wrapper(q.device, False, backend)
    wrapper.plan(_int32(call.qo_indptr), _int32(pages.kv_indptr), _int32(pages.kv_indices), last_page_lengths(pages),
                 heads, pages.k_cache.shape[2], dim, pages.page_size, kv_data_type=pages.k_cache.dtype, **planned)
    return wrapper.run(q, (unit_last_stride(pages.k_cache), unit_last_stride(pages.v_cache)), return_lse=True)


def _entry(name: str, backend: str, waives: tuple[str, ...] = ("input_validation",)) -> Callable:
    def entry(q, k, v, qo_indptr, kv_indptr, *rest):
        return _prefill(read_prefill_call(q, k, v, qo_indptr, kv_indptr, *rest), backend)

    def for_definition(definition):
        """``entry`` for a causal prefill ``definition``; ValueError naming it for decode or a head dim FlashInfer's
        prefill is not built for."""
        if not getattr(definition, "prefill", False):
            raise ValueError(f"FlashInfer prefill does not serve {definition.name}: it is not a causal prefill "
                             "definition (adapters/flashinfer_decode.py serves decode)")
        if definition.head_dim not in _HEAD_DIMS:
            raise ValueError(f"FlashInfer prefill does not serve {definition.name}: head_dim={definition.head_dim} "
                             f"(its prefill is built for {_HEAD_DIMS})")
        return entry

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = (f"FlashInfer's batch prefill wrappers ({backend}, causal) on a prefill definition's arguments "
                     "(paged or ragged); returns (output [total_q, H, D] bf16, lse [total_q, H] float32 base 2).")
    entry.returns_lse = True
    entry.waives = waives
    entry.for_definition = for_definition
    return entry


run = _entry("run", "fa2")
run_as_served = _entry("run_as_served", "fa2", ("empty_sequences", "input_validation"))


# ---- smoke test: python -m adapters.flashinfer_prefill --------------------------------------

_SMOKE_DEFINITIONS = ("gqa_paged_prefill_causal_h32_kv4_d128_ps1", "gqa_paged_prefill_causal_h32_kv8_d128_ps64",
                      "gqa_ragged_prefill_causal_h32_kv4_d128")


def _oracle(definition, call: tuple):
    from gqa_decode_fuzz.reference import prefill_oracle

    if definition.page_size:
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, *last, scale = call
        return prefill_oracle.attend_paged_prefill(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, scale,
                                                   *last)
    return prefill_oracle.attend_ragged_prefill(*call)


def _smoke() -> int:
    """Compile the kernels and check one engine-shaped batch per definition against the float64 oracle's bound;
    then print what rows that see no key give (a known difference, not a smoke failure)."""
    from adapters._paged import example_prefill_call
    from gqa_decode_fuzz.reference import assert_within_bound, definitions

    failures = 0
    for name in _SMOKE_DEFINITIONS:
        definition = definitions.by_name(name)
        served = run.for_definition(definition)
        call = tuple(a.cuda() if isinstance(a, torch.Tensor) else a
                     for a in example_prefill_call(definition, [1, 7, 64, 65, 3], [1, 7, 64, 300, 130], seed=0))
        start = time.perf_counter()
        output, lse = served(*call)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        try:
            ratio = assert_within_bound(output, lse, _oracle(definition, call), context=name)
            worst = f"worst err/bound {ratio:.3g} ok"
        except AssertionError as mismatch:
            failures += 1
            worst = f"MISMATCH {str(mismatch)[:400]}"
        print(f"{name}: {seconds:.1f} s (first call compiles), {worst}")
        blind = tuple(a.cuda() if isinstance(a, torch.Tensor) else a
                      for a in example_prefill_call(definition, [4], [2], seed=1))
        output, lse = served(*blind)
        print(f"  rows 0-1 of q_len 4 over kv_len 2 (they see no key): max |output| "
              f"{output[:2].float().abs().max().item():.3g}, lse {lse[:2, 0].tolist()}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(_smoke())
