"""FlashInfer's paged decode (``BatchDecodeWithPagedKVCacheWrapper``, plan + run) under this suite's contract.

Use (GPU only; FlashInfer compiles its kernels with nvcc on first use)::

    python adapters/flashinfer_package.py            # here: builds .carry/flashinfer (docs/gpu.md)
    PYTHONPATH=.carry/flashinfer python -m adapters.flashinfer_decode     # there: compile + smoke test
    PYTHONPATH=.carry/flashinfer pytest properties --definition=all --impl=adapters/flashinfer_decode.py:run

Written against flashinfer-python 0.3.1 (the trimmed package ``flashinfer_package.py`` builds); the
wrapper's plan/run interface is the same in later releases.

What is called
    One wrapper per device and ``use_tensor_cores`` value, NHD layout, over a 128 MiB zeroed workspace
    (FlashInfer's examples' size), kept for the process as an engine keeps it. Each call plans for its
    batch (``plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim,
    page_size, pos_encoding_mode="NONE", q_data_type=bf16, kv_data_type=bf16, sm_scale=...)``) and runs
    ``run(q, (k_cache, v_cache), return_lse=True)``; FlashInfer's LSE is base 2, as the contract's, and is
    returned as it is. k_cache/v_cache ``[P, page_size, KV heads, D]`` are FlashInfer's NHD pages as they
    are (the kernel reads page, token and head strides; only the last dimension is made contiguous).
    Page size 1 has no ``kv_last_page_len`` in the contract: the adapter passes 1 for each sequence with
    a page and 0 for an empty one, as an engine fills it. Index tensors are passed as int32 (the module
    FlashInfer compiles is specialised on the index type; engines pass int32).

use_tensor_cores (a knob: None, True)
    FlashInfer has two decode kernels. Its default (``use_tensor_cores=False``) is the CUDA-core decode
    kernel, compiled for query groups 1, 2, 3, 4 and 8 only (``DISPATCH_GQA_GROUP_SIZE``,
    include/flashinfer/utils.cuh; any other group fails at run time with "Unsupported group_size").
    ``True`` computes decode with its FlashAttention-2 prefill templates, any group (what SGLang and
    vLLM choose for groups above 4). ``None`` (the first value, toward which failures shrink): the
    default kernel where it has the group, else tensor cores; ``True``: tensor cores. So groups 5 and 6
    (h5 kv1, h20 kv4, h24 kv4, h48 kv8) run the tensor-core kernel only, under either value; every
    other definition runs both. ``for_definition`` refuses only head dims other than 64, 128, 256.

Declarations
    ``run``: the whole contract except input validation (FlashInfer checks shapes, not page ids or
    ``kv_indptr``); an empty sequence goes to the kernel and its answer is reported. ``run_as_served``
    also waives empty sequences (an engine never sends one). ``default_as_served`` waives the same and draws
    no knob: FlashInfer's own choice alone (the tensor-core path's LSE fails nearly every property, which
    hides what the default kernel gets wrong). A batch of no sequences is answered by the adapter without
    calling FlashInfer, as by the torch adapters.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import flashinfer
import torch

from adapters._paged import Call, empty_result, last_page_lengths, read_call, unit_last_stride

__all__ = ["run", "run_as_served"]

_WORKSPACE_BYTES = 128 * 2**20
_DECODE_GROUPS = (1, 2, 3, 4, 8)  # DISPATCH_GQA_GROUP_SIZE: the CUDA-core decode kernel's groups
_HEAD_DIMS = (64, 128, 256)  # the head dims FlashInfer's decode is built and tested for
_wrappers: dict[tuple[str, bool], object] = {}


def _wrapper(device: torch.device, use_tensor_cores: bool):
    key = (str(device), use_tensor_cores)
    if key not in _wrappers:
        workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _wrappers[key] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, kv_layout="NHD", use_tensor_cores=use_tensor_cores)
    return _wrappers[key]


def _decode(call: Call, use_tensor_cores: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if call.q.shape[0] == 0:
        return empty_result(call)
    batch, heads, dim = call.q.shape
    kv_heads = call.k_cache.shape[2]
    wrapper = _wrapper(call.q.device, use_tensor_cores)
    wrapper.plan(call.kv_indptr.to(torch.int32).contiguous(), call.kv_indices.to(torch.int32).contiguous(),
                 last_page_lengths(call), heads, kv_heads, dim, call.page_size, pos_encoding_mode="NONE",
                 q_data_type=call.q.dtype, kv_data_type=call.k_cache.dtype, sm_scale=call.sm_scale)
    pages = (unit_last_stride(call.k_cache), unit_last_stride(call.v_cache))
    output, lse = wrapper.run(unit_last_stride(call.q), pages, return_lse=True)
    return output, lse


def _entry(name: str, waives: tuple[str, ...], knob: bool = True) -> Callable:
    """An entry point; ``knob``: the suite draws ``use_tensor_cores`` (else FlashInfer's own choice always runs)."""

    def entry(q, k_cache, v_cache, kv_indptr, kv_indices, *rest, use_tensor_cores: bool | None = None):
        call = read_call(q, k_cache, v_cache, kv_indptr, kv_indices, *rest)
        if use_tensor_cores is None:  # FlashInfer's default kernel where it has the group, else tensor cores
            use_tensor_cores = q.shape[1] // k_cache.shape[2] not in _DECODE_GROUPS
        return _decode(call, use_tensor_cores)

    def for_definition(definition):
        """``entry`` for ``definition``; ValueError for a head dim FlashInfer's decode is not built for."""
        if definition.head_dim not in _HEAD_DIMS:
            raise ValueError(f"FlashInfer decode does not serve {definition.name}: head_dim={definition.head_dim} "
                             f"(its decode is built for {_HEAD_DIMS})")
        return entry

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = ("FlashInfer's BatchDecodeWithPagedKVCacheWrapper on the contract's arguments (either argument "
                     "order); returns (output [B, H, D] bf16, lse [B, H] float32 base 2).")
    entry.returns_lse = True
    entry.waives = waives
    if knob:
        entry.knobs = {"use_tensor_cores": (None, True)}
    entry.for_definition = for_definition
    return entry


run = _entry("run", ("input_validation",))
run_as_served = _entry("run_as_served", ("empty_sequences", "input_validation"))
# FlashInfer's own choice of kernel alone: the CUDA-core decode where it has the query group. The knob's tensor-core
# path fails nearly every property by its LSE (docs/findings.md), which hides what the default path gets wrong.
default_as_served = _entry("default_as_served", ("empty_sequences", "input_validation"), knob=False)


# ---- smoke test: python -m adapters.flashinfer_decode ---------------------------------------


def _smoke() -> int:
    """Compile both kernels and check one small call per page size against the definition's float32 reference."""
    from adapters._paged import example_call, reference_of
    from gqa_decode_fuzz.reference import definitions

    failures = 0
    for name in ("gqa_paged_decode_h32_kv4_d128_ps1", "gqa_paged_decode_h32_kv8_d128_ps64"):
        definition = definitions.BUILT_IN[name]
        call = tuple(a.cuda() if isinstance(a, torch.Tensor) else a
                     for a in example_call(definition, [1, 7, 64, 65, 300], seed=0))
        expected_output, expected_lse = reference_of(definition)(*call)
        for use_tensor_cores in (None, True):
            start = time.perf_counter()
            output, lse = run(*call, use_tensor_cores=use_tensor_cores)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            error = (output.float() - expected_output.float()).abs().max().item()
            lse_error = (lse - expected_lse).abs().max().item()
            ok = error < 2e-2 and lse_error < 1e-3  # a smoke check, not the suite's bound
            failures += not ok
            print(f"{name} use_tensor_cores={use_tensor_cores}: {seconds:.1f} s (first call compiles), "
                  f"max |output err| {error:.3g}, max |lse err| {lse_error:.3g} {'ok' if ok else 'MISMATCH'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(_smoke())
