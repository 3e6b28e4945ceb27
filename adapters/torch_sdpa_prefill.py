"""PyTorch's attention backends for causal prefill, paged and ragged: ``math``, ``flash``, ``efficient``, ``cudnn``.

Use: ``pytest properties --definition=prefill --impl=adapters/torch_sdpa_prefill.py:math`` (or ``flash``,
``efficient``, ``cudnn``). Every entry serves every causal prefill definition (paged, any page size, and ragged);
``for_definition`` refuses a decode definition (``adapters/torch_sdpa.py`` serves those) and a head dim the
backend is not built for, naming the definition. ``math`` runs on CPU too (CI runs it); the others need CUDA.

The mask
    The contract's mask is bottom-right aligned (query i of q_len sees keys j <= i + kv_len - q_len), torch's
    ``torch.nn.attention.bias.causal_lower_right(q_len, kv_len)``. One call per sequence of the batch, as that
    bias takes one (q_len, kv_len): the sequence's queries ``[1, H, q_len, D]`` over its keys, gathered out of the
    pool in token order (``adapters/_paged.py``) or sliced out of ragged K/V. A sequence with no queries is not
    called; one with no keys is called with zero keys and its answer reported as it is.

What each entry calls (``CausalBias._dispatch``, torch/nn/attention/bias.py, as of torch 2.13)
    - ``math``: ``F.scaled_dot_product_attention(..., attn_mask=causal_lower_right(q_len, kv_len),
      enable_gqa=True)`` under ``sdpa_kernel(SDPBackend.MATH)``: the public call itself (the bias is materialised
      as a boolean mask, or is plain ``is_causal`` where q_len == kv_len). The math path returns no LSE; this
      adapter computes it from the same bf16 inputs in float32 under the same mask (base 2), as the decode
      adapter's ``math`` does: ``math``'s LSE is the adapter's arithmetic, its output the backend's.
    - ``flash``: what the bias dispatches to when FlashAttention can run, called directly to keep its LSE:
      ``aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal=True, ...)``, whose causal mask is the
      lower-right one (torch's own comment there). Grouped KV heads as they are.
    - ``efficient``: likewise ``aten._efficient_attention_forward(..., custom_mask_type=2, compute_log_sumexp=True)``
      (2 = ``CausalVariant.LOWER_RIGHT``, the CUTLASS kernel's causal-from-bottom-right). The CUTLASS kernel takes
      no grouped heads (the dispatch would fall back to a materialised mask): KV heads are repeated to the query
      heads, as ``adapters/torch_sdpa.py`` does for it.
    - ``cudnn``: torch has no lower-right path for cuDNN; the bias falls back to its materialised mask, which SDPA
      passes to cuDNN as an additive bias. This entry does that itself, ``aten._scaled_dot_product_cudnn_attention``
      with the 0 / -inf bias of the lower-right mask (keys padded to a multiple of 16, the padding masked) and
      ``compute_log_sumexp=True``, KV heads repeated.

    The fused backends' natural-log LSE is returned in base 2 (times log2 e). Rows that see no key are reported
    as each backend gives them (math: output 0 by its safe softmax; the LSE -inf by the adapter's logsumexp).

Declarations
    All entries return an LSE and waive ``input_validation`` (library calls on dense tensors; the contract's
    checks belong to a kernel's wrapper, and the gather checks nothing). ``flash_as_served`` and
    ``efficient_as_served`` also waive ``empty_sequences``: rows that see no key (an engine masks or never reads
    them) are read as the contract's (0, -inf), the rest checked in full; their backends' own answers for such rows
    (FA2's LSE +inf, the CUTLASS kernel's arbitrary LSE) are a convention apart from the contract's. A call of
    no query rows is answered by the adapter (empty tensors) without calling a backend, as no engine launches
    attention for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalVariant, causal_lower_right

from adapters._paged import PrefillCall, Tokens, empty_result, read_prefill_call, unit_last_stride
from adapters.torch_sdpa import _CUDNN_KEY_ALIGN, _HEAD_DIM_OK, _LOG2_E, _repeat_heads

__all__ = ["cudnn", "efficient", "efficient_as_served", "flash", "flash_as_served", "math"]

Backend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


def visible_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, kv_len] bool: query i sees key j when j <= i + kv_len - q_len (causal_lower_right's mask)."""
    return torch.ones((q_len, kv_len), dtype=torch.bool, device=device).tril(kv_len - q_len)


def _lse_rows(lse: torch.Tensor, heads: int, q_len: int, backend: str) -> torch.Tensor:
    """A backend's natural-log LSE of one sequence as [q_len, H] base 2: flash gives [1, H, q_len], the CUTLASS
    kernel [1, H, q_len rounded up], cuDNN [1, H, q_len(, 1)]."""
    if lse.dim() < 3 or tuple(lse.shape[:2]) != (1, heads) or lse[0].numel() < heads * q_len:
        raise RuntimeError(f"{backend}: unexpected LSE shape {tuple(lse.shape)} for {q_len} queries of {heads} heads "
                           "(this adapter reads [1, H, q_len, ...])")
    return (lse.reshape(heads, -1)[:, :q_len].t().float() * _LOG2_E).contiguous()


# ---- backends: one sequence, q [1, H, q_len, D], k and v [1, H_kv, kv_len, D] ----------------------------------


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    heads, q_len, dim = q.shape[1:]
    kv_heads, kv_len = k.shape[1:3]
    with sdpa_kernel(SDPBackend.MATH):
        output = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, kv_len), scale=scale,
                                                enable_gqa=True)
    # The math path returns no LSE: the adapter's own, float32 from the same inputs under the same mask.
    grouped = q[0].float().reshape(kv_heads, heads // kv_heads, q_len, dim)
    logits = torch.einsum("kgqd,ktd->kgqt", grouped, k[0].float()) * scale
    logits = logits.masked_fill(~visible_mask(q_len, kv_len, q.device), -torch.inf)
    lse = torch.logsumexp(logits.reshape(heads, q_len, kv_len), dim=-1) * _LOG2_E
    return output, lse.t().contiguous()


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    output, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, is_causal=True, return_debug_mask=False, scale=scale)
    return output, _lse_rows(lse, q.shape[1], q.shape[2], "flash")


def _efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    heads = q.shape[1]
    k, v = (_repeat_heads(t, heads, 1) for t in (k, v))
    output, lse, *_ = torch.ops.aten._efficient_attention_forward(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias=None, cu_seqlens_q=None, cu_seqlens_k=None,
        max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0, custom_mask_type=int(CausalVariant.LOWER_RIGHT),
        compute_log_sumexp=True, scale=scale, seqlen_k=None)
    return output.transpose(1, 2), _lse_rows(lse, heads, q.shape[2], "efficient")


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    heads, q_len = q.shape[1:3]
    kv_len = k.shape[2]
    padded = max(1, -(-kv_len // _CUDNN_KEY_ALIGN)) * _CUDNN_KEY_ALIGN  # at least one block, as the decode adapter
    k, v = (F.pad(_repeat_heads(t, heads, 1), (0, 0, 0, padded - kv_len)) for t in (k, v))
    seen = F.pad(visible_mask(q_len, kv_len, q.device), (0, padded - kv_len), value=False)
    bias = torch.zeros(seen.shape, dtype=q.dtype, device=q.device).masked_fill(~seen, -torch.inf)
    output, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, bias[None, None].expand(1, heads, q_len, padded), True, 0.0, False, False, scale=scale)
    return output, _lse_rows(lse, heads, q_len, "cudnn")


_BACKENDS: dict[str, Backend] = {"math": _math, "flash": _flash, "efficient": _efficient, "cudnn": _cudnn}


# ---- the batch ------------------------------------------------------------------------------


def _one_sequence(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[q_len, H, D] queries and [kv_len, H_kv, D] keys and values as SDPA's [1, heads, length, D]."""
    return tuple(unit_last_stride(t.transpose(0, 1)[None]) for t in (q, keys, values))


def _attend(backend: str, call: PrefillCall) -> tuple[torch.Tensor, torch.Tensor]:
    q = call.q
    output = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    tokens: Tokens = call.tokens()
    q_bounds, kv_bounds = call.query_bounds, tokens.cu_seqlens.tolist()
    for b in range(len(q_bounds) - 1):
        rows = slice(q_bounds[b], q_bounds[b + 1])
        if rows.start == rows.stop:
            continue
        keys = slice(kv_bounds[b], kv_bounds[b + 1])
        sequence_out, sequence_lse = _BACKENDS[backend](
            *_one_sequence(q[rows], tokens.keys[keys], tokens.values[keys]), call.sm_scale)
        output[rows] = sequence_out[0].transpose(0, 1)
        lse[rows] = sequence_lse
    return output, lse


def _for_definition(entry: Callable, backend: str) -> Callable:
    def for_definition(definition):
        """``entry`` for a causal prefill ``definition``; ValueError naming it for decode or a head dim it lacks."""
        if not getattr(definition, "prefill", False):
            raise ValueError(f"torch SDPA prefill ({backend}) does not serve {definition.name}: it is not a causal "
                             "prefill definition (adapters/torch_sdpa.py serves decode)")
        if not _HEAD_DIM_OK[backend](definition.head_dim):
            raise ValueError(f"{backend} attention does not serve {definition.name}: head_dim={definition.head_dim} "
                             "is not one its kernels are built for")
        return entry
    return for_definition


def _entry(backend: str, *, as_served: bool = False) -> Callable:
    def entry(q, k, v, qo_indptr, kv_indptr, *rest):
        call = read_prefill_call(q, k, v, qo_indptr, kv_indptr, *rest)
        if backend != "math" and q.device.type != "cuda":
            raise ValueError(f"{backend} attention needs CUDA tensors; q is on {q.device} (use the math entry on CPU)")
        if q.shape[0] == 0:
            return empty_result(call)
        return _attend(backend, call)

    entry.__name__ = entry.__qualname__ = f"{backend}_as_served" if as_served else backend
    entry.__doc__ = (f"PyTorch's {backend} attention, causal lower-right, on a prefill definition's arguments (paged "
                     "or ragged); returns (output [total_q, H, D] bf16, lse [total_q, H] float32 base 2)"
                     + ("; declared as an engine serves it (rows that see no key unchecked)." if as_served else "."))
    entry.returns_lse = True
    entry.waives = ("empty_sequences", "input_validation") if as_served else ("input_validation",)
    entry.for_definition = _for_definition(entry, backend)
    return entry


math = _entry("math")
flash = _entry("flash")
flash_as_served = _entry("flash", as_served=True)
efficient = _entry("efficient")
efficient_as_served = _entry("efficient", as_served=True)
cudnn = _entry("cudnn")
