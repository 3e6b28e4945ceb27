"""SGLang's Triton decode attention (grouped path, any page size) under this suite's contract.

Use: ``pytest properties --impl=adapters/sglang_decode.py:run`` with the ``sglang`` wheel installed
(``pip install --no-deps sglang`` is enough; written against sglang 0.5.23). Both entries serve every
definition of the family (``for_definition``; ``--definition=all``): page size 1 and larger pages.

Pages of several tokens
    SGLang's kernel indexes tokens, not pages: ``kv_indptr`` counts tokens and ``kv_indices`` holds token
    slots of a ``[slots, KV heads, D]`` pool; with ``page_size=N`` it splits each slot into page id
    (``slot // N``) and position (``slot % N``) and addresses ``page * page_stride + position *
    slot_stride``. SGLang's engine builds those slots from its ``req_to_token`` table. For a definition
    with pages of N tokens the adapter does the same from the contract's page table: slot = page id * N
    + position, the first ``(pages - 1) * N + kv_last_page_len`` slots of each sequence, in the caller's
    index dtype (int32 stays int32; a pool whose slots pass int32 is refused, naming kv_indices), and
    passes ``k_cache.flatten(0, 1)`` (a view for a pool whose pages are contiguous in their tokens,
    else a copy) with ``page_size=N``, as ``TritonAttnBackend`` passes its ``page_size``.

What is called
    ``decode_attention_fwd`` from ``sglang.kernels.ops.attention.decode_attention`` (0.5.23; older
    wheels have it at ``sglang.srt.layers.attention.triton_ops.decode_attention``). With query
    groups above 1 (every definition of the family) it takes the grouped path: stage 1
    (``_fwd_grouped_kernel_stage1``) splits each sequence over ``num_kv_splits[b]`` blocks and writes
    float32 partial outputs and natural-log partial LSEs into ``attn_logits`` / ``attn_lse``; stage 2
    (``_fwd_kernel_stage2``) merges them into the bf16 output. Stage 2 stores no merged LSE, so this
    adapter returns ``(output, None)`` and sets ``run.returns_lse = False``; it computes no LSE of its own.

How the module is imported
    First the ordinary import. Without SGLang's server dependencies that fails: importing any
    ``sglang.*`` module runs ``sglang/__init__.py``, which needs orjson, transformers and the rest,
    and the kernel module imports ``sglang.srt.utils``, whose ``__init__`` pulls in the server.
    Then (and only then) the kernel file is loaded by path with these entries placed in
    ``sys.modules`` for the duration of that one import, and all of them removed afterwards:

    - empty package modules for each parent package (``sglang``, ``sglang.kernels``, ...) whose
      ``__path__`` is the installed directory, so the real submodules below load from their files
      without running any package ``__init__``;
    - a stub ``sglang.srt.utils`` with the four names the kernel module imports from it:
      ``is_hip`` (as SGLang's: ``torch.version.hip is not None``), ``is_gfx95_supported`` and
      ``is_gfx1250_supported`` (False off ROCm, as SGLang's), ``get_device_core_count`` (SM count
      on CUDA, else 0, as SGLang's). Off ROCm the kernel module only calls ``is_hip`` (at import).

    The kernel module's other two imports are SGLang's real files: ``sglang.srt.environ`` (standard
    library only; only read on ROCm paths) and ``sglang.kernels.ops.attention.score_mod`` (triton
    only). Its lazy ``sglang.srt.runtime_context`` import is reached only on ROCm MLA paths. A
    failed first import can leave half-imported ``sglang.*`` modules and environment variables
    (SGLang's cache redirection) behind; both are rolled back before the fallback.

How the kernel is called (as ``TritonAttnBackend.forward_decode`` calls it, eager mode)
    - ``k_cache.flatten(0, 1)`` / ``v_cache.flatten(0, 1)`` ([P * page size, KV heads, D]; for page size 1
      a view) as the 3-D token pool; q as given.
      The kernel indexes the last dimension of q, K and V with unit stride and ``kv_indptr`` /
      ``kv_indices`` as flat arrays, so exactly those are made contiguous when they are not.
      No dtype is converted: the kernel takes int32 or int64 indices as given (SGLang's backend
      itself passes int32 ``kv_indptr`` and int64 ``kv_indices``).
    - output ``torch.empty`` like q; ``attn_logits`` [B, H, S, D] and ``attn_lse`` [B, H, S]
      float32 ``torch.empty`` with S = max_kv_splits, as the backend's eager path allocates them.
    - k_scale = v_scale = 1.0 (bf16 cache), no logit cap, no sinks, no score_mod, Lean decode off
      (it is ROCm-only), ``use_pdl`` on CUDA devices of compute capability 9+ (as the backend).
    - sm_scale: the caller's value as a Python float, default 1/sqrt(head dim).

num_kv_splits
    ``None`` (default): max_kv_splits = 8 (``--triton-attention-num-kv-splits`` default) and a
    per-sequence count chosen like ``TritonAttnBackend.get_num_kv_splits`` does by default (its
    Triton helper, reimplemented in ``_backend_split_counts``). Two deliberate departures: the
    lengths the heuristic sees are clamped to at least 1 (in serving a decode step never has an
    empty sequence; with a zero the heuristic divides by zero), and on a machine without CUDA it is
    sized for an H200 (132 SMs) instead of SGLang's "no device: use max_kv_splits", so that an
    interpreter run schedules like the GPU. An int N: every sequence gets N splits and
    max_kv_splits = N, i.e. the backend under ``SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS=1``
    with ``--triton-attention-num-kv-splits N``.

No validation
    SGLang trusts its caller, and so does this adapter: shapes, dtypes, devices, page ids and
    ``kv_indptr`` go to the kernel unchecked (the suite reports that as a contract difference).
    Only the adapter's own knob is checked (num_kv_splits >= 1).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

import numpy as np
import torch

from adapters._paged import Call, read_call, unit_last_stride

__all__ = ["run", "run_as_served"]

_MODULE_PATHS = (
    "sglang.kernels.ops.attention.decode_attention",  # sglang >= 0.5.2x
    "sglang.srt.layers.attention.triton_ops.decode_attention",  # older wheels
)
_DEFAULT_MAX_KV_SPLITS = 8  # --triton-attention-num-kv-splits default
_STAND_IN_CORES = 132  # H200 SM count, used when there is no CUDA device (interpreter runs)
_HEAD_TILE = 16  # stage-1 heads per program (decode_attention._GROUPED_BLOCK_H)

# ---- import ----------------------------------------------------------------------------------


def _utils_stub() -> types.ModuleType:
    stub = types.ModuleType("sglang.srt.utils")
    stub.__doc__ = "Stand-in for sglang.srt.utils: only what the decode kernel module imports."

    def is_hip() -> bool:
        return torch.version.hip is not None

    def _gcn_arch_has(name: str) -> bool:
        return bool(torch.version.hip) and name in torch.cuda.get_device_properties(0).gcnArchName

    def get_device_core_count(device_id: int = 0) -> int:
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(device_id).multi_processor_count
        return 0

    stub.is_hip = is_hip
    stub.is_gfx95_supported = lambda: _gcn_arch_has("gfx95")
    stub.is_gfx1250_supported = lambda: _gcn_arch_has("gfx1250")
    stub.get_device_core_count = get_device_core_count
    return stub


def _package(name: str, directory: str) -> types.ModuleType:
    package = types.ModuleType(name)
    package.__path__ = [directory]
    package.__package__ = name
    return package


def _locate() -> tuple[str, str, str]:
    """(installed sglang directory, dotted name, file) of the decode kernel module; runs no sglang code."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the sglang wheel is not installed (pip install --no-deps sglang)")
    root = list(spec.submodule_search_locations)[0]
    for dotted in _MODULE_PATHS:
        path = os.path.join(root, *dotted.split(".")[1:]) + ".py"
        if os.path.isfile(path):
            return root, dotted, path
    raise ImportError(f"no SGLang decode attention module under {root}; looked for {_MODULE_PATHS}")


def _load_by_path(root: str, dotted: str, path: str):
    """Load the kernel file with only the stubs it needs in sys.modules, removed again afterwards."""
    parts = dotted.split(".")
    temporary = {}
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        temporary[name] = _package(name, os.path.join(root, *parts[1:depth]))
    temporary.setdefault("sglang.srt", _package("sglang.srt", os.path.join(root, "srt")))
    temporary["sglang.srt.utils"] = _utils_stub()
    before = set(sys.modules)
    saved = {name: sys.modules[name] for name in temporary if name in sys.modules}
    sys.modules.update(temporary)
    try:
        spec = importlib.util.spec_from_file_location(dotted, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[dotted] = module
        spec.loader.exec_module(module)
    finally:
        for name in set(sys.modules) - before:  # SGLang's modules only: triton, if first imported here, stays
            if name == "sglang" or name.startswith("sglang."):
                del sys.modules[name]
        for name in temporary:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
    return module


def _import_kernel_module():
    root, dotted, path = _locate()
    modules_before = set(sys.modules)
    environ_before = dict(os.environ)
    try:
        return importlib.import_module(dotted)
    except Exception:  # noqa: BLE001 - a missing server dependency, or one that fails to initialise
        pass
    # Roll back what the failed import left: half-imported sglang.* modules, SGLang's cache env vars.
    for name in set(sys.modules) - modules_before:
        if name == "sglang" or name.startswith("sglang."):
            del sys.modules[name]
    for key in set(os.environ) - set(environ_before):
        del os.environ[key]
    return _load_by_path(root, dotted, path)


# Imported with this module, so a missing wheel fails --impl at once (the suite imports an --impl
# after it has set TRITON_INTERPRET, which must precede any @triton.jit import).
_kernel_module = _import_kernel_module()


# ---- split counts ----------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _backend_split_counts(lengths: list[int], num_heads: int, num_kv_heads: int, max_splits: int,
                          cores: int) -> list[int]:
    """Per-sequence split counts as SGLang's backend picks them (get_num_kv_splits, default mode).

    Two candidate chunk sizes, each sized on the longest sequence: one from how uneven the batch
    is (longest / shortest, unless they are within 25%), one from how many stage-1 programs it
    takes to fill the device (more for longer contexts); a sequence gets enough splits for the
    smaller chunk. Never more than ``max_splits`` splits of the longest sequence.
    """
    if not lengths:
        return []
    lengths = [max(n, 1) for n in lengths]
    longest, shortest = max(lengths), min(lengths)
    if longest * 8 < shortest * 10:
        shortest = longest
    chunk_uneven = _cdiv(longest, min(_cdiv(longest, shortest), max_splits))
    # float32 as the Triton helper computes it, truncated to int
    growth = max(np.log2(np.float32(longest) / np.float32(64.0)), np.float32(1.0))
    programs = int(np.float32(cores) * np.float32(growth))
    programs_per_split = len(lengths) * _cdiv(num_heads, min(_HEAD_TILE, num_heads // num_kv_heads))
    chunk_fill = _cdiv(longest, min(_cdiv(programs, programs_per_split), max_splits))
    return [max(_cdiv(n, chunk_uneven), _cdiv(n, chunk_fill)) for n in lengths]


def _split_counts(kv_indptr: torch.Tensor, num_heads: int, num_kv_heads: int, requested: int | None,
                  device: torch.device) -> tuple[torch.Tensor, int]:
    batch = kv_indptr.shape[0] - 1
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"num_kv_splits must be an int >= 1 or None, got {requested!r}")
        return torch.full((batch,), requested, dtype=torch.int32, device=device), requested
    bounds = kv_indptr.tolist()
    lengths = [bounds[b + 1] - bounds[b] for b in range(batch)]
    if device.type == "cuda":
        cores = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        cores = _STAND_IN_CORES
    counts = _backend_split_counts(lengths, num_heads, num_kv_heads, _DEFAULT_MAX_KV_SPLITS, cores)
    return torch.tensor(counts, dtype=torch.int32, device=device), _DEFAULT_MAX_KV_SPLITS


# ---- the contract ----------------------------------------------------------------------------


def _token_slots(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr over tokens, kv_indices of token slots) for pages of several tokens, as SGLang's engine builds them
    from ``req_to_token``: slot = page id * page_size + position in the page, in the caller's index dtype."""
    size = call.page_size
    bounds = call.kv_indptr.tolist()
    counts = torch.tensor([b - a for a, b in zip(bounds, bounds[1:])], dtype=torch.int64)
    last = call.kv_last_page_len.to(torch.int64).cpu()
    tokens = torch.where(counts > 0, (counts - 1) * size + last, 0)
    device = call.kv_indices.device
    pages = call.kv_indices[bounds[0]:bounds[-1]].to(torch.int64)
    slots = (pages[:, None] * size + torch.arange(size, device=device)).reshape(-1)
    # keep the first `tokens` slots of each sequence's pages
    starts = torch.repeat_interleave(counts.cumsum(0) - counts, tokens) * size
    within = torch.arange(int(tokens.sum())) - torch.repeat_interleave(tokens.cumsum(0) - tokens, tokens)
    slots = slots[(starts + within).to(device)]
    dtype = call.kv_indices.dtype
    if dtype == torch.int32 and slots.numel() and int(slots.max()) > 2**31 - 1:
        raise ValueError("kv_indices: token slots pass int32 in this pool; pass int64 page ids")
    indptr = torch.cat([tokens.new_zeros(1), tokens.cumsum(0)]).to(call.kv_indptr.dtype)
    return indptr.to(call.kv_indptr.device), slots.to(dtype)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, *rest, num_kv_splits=None):
    """SGLang's ``decode_attention_fwd`` on the contract's arguments (either argument order); returns
    ``(output, None)``."""
    call = read_call(q, k_cache, v_cache, kv_indptr, kv_indices, *rest)
    kernel = _kernel_module
    device = q.device
    batch, num_heads, head_dim = q.shape
    size = call.page_size
    k_pool = unit_last_stride(k_cache.flatten(0, 1))  # [P * page_size, KV heads, D]: SGLang's token pool
    v_pool = unit_last_stride(v_cache.flatten(0, 1))
    if call.kv_last_page_len is None:
        kv_indptr, kv_indices = kv_indptr.contiguous(), kv_indices.contiguous()
    else:
        kv_indptr, kv_indices = _token_slots(call)
    splits, max_splits = _split_counts(kv_indptr, num_heads, k_pool.shape[-2], num_kv_splits, device)
    output = torch.empty(q.shape, dtype=q.dtype, device=device)
    attn_logits = torch.empty((batch, num_heads, max_splits, v_pool.shape[-1]), dtype=torch.float32, device=device)
    attn_lse = torch.empty((batch, num_heads, max_splits), dtype=torch.float32, device=device)
    use_pdl = device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9
    kernel.decode_attention_fwd(
        unit_last_stride(q), k_pool, v_pool, output, kv_indptr, kv_indices, attn_logits, attn_lse,
        splits, max_splits, call.sm_scale, 1.0, 1.0, use_pdl=use_pdl, page_size=size,
    )
    return output, None


run.knobs = {"num_kv_splits": (None, 1, 2, 3, 4, 8, 16)}
run.returns_lse = False


def run_as_served(q, k_cache, v_cache, kv_indptr, kv_indices, *rest, num_kv_splits=None):
    """``run``, declared as SGLang's engine uses it: it never sends an empty sequence (padding rows get
    length 1) nor a page id outside the pool, so those parts of the contract are waived (docs/findings.md
    has what ``run`` does with them)."""
    return run(q, k_cache, v_cache, kv_indptr, kv_indices, *rest, num_kv_splits=num_kv_splits)


run_as_served.knobs = run.knobs
run_as_served.returns_lse = False
run_as_served.waives = ("empty_sequences", "input_validation")


def _serves(entry):
    def for_definition(definition):
        """``entry`` for ``definition``: SGLang's grouped decode takes any group, head dim and page size."""
        return entry
    return for_definition


run.for_definition = _serves(run)
run_as_served.for_definition = _serves(run_as_served)
