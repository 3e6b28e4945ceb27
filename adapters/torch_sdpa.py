"""PyTorch's own attention backends under this suite's contract: ``flash``, ``efficient``, ``cudnn``, ``math``.

Use: ``pytest properties --impl=adapters/torch_sdpa.py:flash`` (or ``efficient``, ``cudnn``, ``math``, or an
``*_as_served`` entry). Every entry serves every definition of the family (``--definition=all``): shapes are
read from the tensors, and each entry's ``for_definition`` refuses a definition its backend cannot take
(head dims the fused kernels do not compile for), naming why. ``math`` runs on CPU too (CI runs it);
the others need a CUDA device.

What each entry does
    The paged pool is gathered first (``adapters/_paged.py``): each sequence's tokens, in order, from the
    pages it references; the unused slots of a last page are dropped. That is how a caller with a paged
    cache reaches these dense or ragged backends; it is the adapter's code, not the backend's.

    - ``flash``: ``torch.ops.aten._flash_attention_forward`` (FlashAttention-2), the varlen entry:
      one query token per sequence (``cu_seqlens_q = 0..B``), the gathered keys as one ragged batch
      (``cu_seqlens_k``), grouped KV heads as they are (FlashAttention takes ``num_heads % num_heads_k == 0``).
      Its natural-log ``softmax_lse`` is returned in base 2.
    - ``efficient``: ``torch.ops.aten._efficient_attention_forward`` (the CUTLASS memory-efficient kernel),
      varlen the same way, ``compute_log_sumexp=True``; KV heads repeated to the query heads, as SDPA's
      grouped-query path does for this backend. Natural-log LSE returned in base 2.
    - ``cudnn``: ``torch.ops.aten._scaled_dot_product_cudnn_attention`` with ``compute_log_sumexp=True``: a
      dense batch, keys padded to the longest sequence (rounded up to 16) and masked with an additive
      ``attn_bias`` of 0 / -inf, KV heads repeated. Natural-log LSE returned in base 2.
    - ``math``: ``torch.nn.functional.scaled_dot_product_attention`` under ``sdpa_kernel(SDPBackend.MATH)``,
      one sequence at a time, ``enable_gqa=True``. The math path returns no LSE; this adapter computes it
      from the same bf16 inputs in float32 (logits ``sm_scale * q.K^T``, ``logsumexp``, base 2), so
      ``math``'s LSE is the adapter's arithmetic, the output the backend's.

Declarations
    All entries return an LSE (``returns_lse`` left True) and waive ``input_validation``: these are library
    calls on dense tensors; the contract's checks (page ids inside the pool, a well-formed ``kv_indptr``,
    dtypes) belong to a kernel's wrapper, and the only code here that could read out of bounds is the
    adapter's gather. The ``flash``, ``efficient``, ``cudnn`` and ``math`` entries are held to the rest of
    the contract, empty sequences included: the backend is given a zero-length key sequence and its answer
    is reported as it is. The ``*_as_served`` entries also waive ``empty_sequences``: an engine never sends
    a decode row with no tokens. A batch of no sequences is answered by the adapter (empty tensors) without
    calling a backend, as no engine launches attention for it.
"""

from __future__ import annotations

import itertools
import math as _math
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torch.nn.attention import SDPBackend, sdpa_kernel

from adapters._paged import Call, Tokens, empty_result, gather_tokens, read_call, unit_last_stride

__all__ = ["cudnn", "cudnn_as_served", "efficient", "efficient_as_served", "flash", "flash_as_served", "math"]

_LOG2_E = 1.0 / _math.log(2.0)
_CUDNN_KEY_ALIGN = 16  # padded key length: a bias row of bf16 16-byte aligned with room to spare


# ---- results --------------------------------------------------------------------------------


def _lse_rows(lse: torch.Tensor, batch: int, heads: int, backend: str) -> torch.Tensor:
    """A backend's natural-log LSE as [B, H] base 2. FlashAttention's varlen LSE is [H, total_q] (or [B, H, max_q]
    in older builds), the CUTLASS kernel's [B, H, max_q rounded up], cuDNN's [B, H, 1(, 1)]."""
    if lse.dim() == 2 and tuple(lse.shape) == (heads, batch):
        rows = lse.t()
    elif lse.dim() >= 3 and tuple(lse.shape[:2]) == (batch, heads):
        rows = lse.reshape(batch, heads, -1)[:, :, 0]
    else:
        raise RuntimeError(f"{backend}: unexpected LSE shape {tuple(lse.shape)} for {batch} sequences of {heads} "
                           "heads (this adapter reads [H, B], or [B, H, ...] with the query token first)")
    return (rows.float() * _LOG2_E).contiguous()


def _repeat_heads(tensor: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """KV heads repeated so that query head h meets KV head h // group (what SDPA's enable_gqa does)."""
    group = heads // tensor.shape[dim]
    return tensor if group == 1 else tensor.repeat_interleave(group, dim=dim)


def _needs_cuda(call: Call, backend: str) -> None:
    if call.q.device.type != "cuda":
        raise ValueError(f"{backend} attention needs CUDA tensors; q is on {call.q.device} (use the math entry on CPU)")


# ---- backends -------------------------------------------------------------------------------


def _flash(call: Call, tokens: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, _ = call.q.shape
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=call.q.device)
    output, lse, *_ = torch.ops.aten._flash_attention_forward(
        unit_last_stride(call.q), tokens.keys, tokens.values, cu_q, tokens.cu_seqlens, 1, max(tokens.lengths),
        0.0, False, False, scale=call.sm_scale)
    return output, _lse_rows(lse, batch, heads, "flash")


def _efficient(call: Call, tokens: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, _ = call.q.shape
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=call.q.device)
    keys, values = (_repeat_heads(t, heads, 1)[None] for t in (tokens.keys, tokens.values))
    output, lse, *_ = torch.ops.aten._efficient_attention_forward(
        unit_last_stride(call.q)[None], keys, values, None, cu_q, tokens.cu_seqlens, 1, max(tokens.lengths),
        0.0, 0, True, scale=call.sm_scale)
    return output[0], _lse_rows(lse, batch, heads, "efficient")


def _padded(tokens: Tokens, padded_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values as [B, L, Hkv, D] with every sequence from position 0, and the additive bias [B, L]."""
    batch, device = len(tokens.lengths), tokens.keys.device
    lengths = torch.tensor(tokens.lengths, device=device)
    owner = torch.repeat_interleave(torch.arange(batch, device=device), lengths)
    position = torch.arange(tokens.keys.shape[0], device=device) - tokens.cu_seqlens[:-1].long()[owner]
    shape = (batch, padded_length, *tokens.keys.shape[1:])
    keys, values = tokens.keys.new_zeros(shape), tokens.values.new_zeros(shape)
    keys[owner, position] = tokens.keys
    values[owner, position] = tokens.values
    slots = torch.arange(padded_length, device=device)
    bias = torch.zeros((batch, padded_length), dtype=tokens.keys.dtype, device=device)
    return keys, values, bias.masked_fill(slots[None, :] >= lengths[:, None], -_math.inf)


def _cudnn(call: Call, tokens: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
    # At least one aligned block of keys: with none (every sequence empty) cuDNN returns no LSE at all; masked keys
    # give the backend's own answer for an empty row.
    blocks = max(1, -(-max(tokens.lengths) // _CUDNN_KEY_ALIGN))
    return _cudnn_padded(call, *_padded(tokens, blocks * _CUDNN_KEY_ALIGN))


def _cudnn_padded(call: Call, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN on the padded batch: keys and values [B, L, Hkv, D], bias [B, L]."""
    batch, heads, _ = call.q.shape
    keys, values = (_repeat_heads(t, heads, 2).transpose(1, 2) for t in (keys, values))  # [B, H, L, D]
    output, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        unit_last_stride(call.q)[:, :, None, :], keys, values, bias[:, None, None, :].expand(-1, heads, 1, -1),
        True, 0.0, False, False, scale=call.sm_scale)
    return output[:, :, 0, :], _lse_rows(lse, batch, heads, "cudnn")


def _math_path(call: Call, tokens: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, dim = call.q.shape
    kv_heads = tokens.keys.shape[1]
    output = torch.empty(call.q.shape, dtype=call.q.dtype, device=call.q.device)
    lse = torch.empty((batch, heads), dtype=torch.float32, device=call.q.device)
    bounds = list(itertools.accumulate(tokens.lengths, initial=0))
    for b in range(batch):
        keys, values = tokens.keys[bounds[b]:bounds[b + 1]], tokens.values[bounds[b]:bounds[b + 1]]
        query = call.q[b]
        with sdpa_kernel(SDPBackend.MATH):
            output[b] = F.scaled_dot_product_attention(
                query[None, :, None, :], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                scale=call.sm_scale, enable_gqa=True)[0, :, 0, :]
        # The math path returns no LSE: the adapter's own, float32 from the same inputs.
        logits = torch.einsum("kgd,tkd->kgt", query.float().reshape(kv_heads, heads // kv_heads, dim), keys.float())
        lse[b] = torch.logsumexp(logits.reshape(heads, -1) * call.sm_scale, dim=-1) * _LOG2_E
    return output, lse



# ---- entries --------------------------------------------------------------------------------

_BACKENDS: dict[str, Callable[[Call, Tokens], tuple[torch.Tensor, torch.Tensor]]] = {
    "flash": _flash, "efficient": _efficient, "cudnn": _cudnn, "math": _math_path,
}
# Head dims each fused backend is built for on the GPUs the suite runs on (FlashAttention-2 and cuDNN: up to 256,
# multiples of 8; the CUTLASS kernel: multiples of 8 for its aligned loads). math takes any.
_HEAD_DIM_OK: dict[str, Callable[[int], bool]] = {
    "flash": lambda d: d % 8 == 0 and d <= 256,
    "efficient": lambda d: d % 8 == 0,
    "cudnn": lambda d: d % 8 == 0 and d <= 256,
    "math": lambda d: True,
}


def _attend(backend: str, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    call = read_call(*args)
    if backend != "math":
        _needs_cuda(call, backend)
    if call.q.shape[0] == 0:
        return empty_result(call)
    return _BACKENDS[backend](call, gather_tokens(call))


def _for_definition(entry: Callable, backend: str) -> Callable:
    def for_definition(definition):
        """``entry`` for ``definition`` (a reference.definitions.Definition); ValueError for a head dim it lacks."""
        if not _HEAD_DIM_OK[backend](definition.head_dim):
            raise ValueError(f"{backend} attention does not serve {definition.name}: head_dim={definition.head_dim} "
                             "is not one its kernels are built for")
        return entry
    return for_definition


def _entry(backend: str, *, as_served: bool) -> Callable:
    def entry(q, k_cache, v_cache, kv_indptr, kv_indices, *rest):
        return _attend(backend, (q, k_cache, v_cache, kv_indptr, kv_indices, *rest))

    entry.__name__ = entry.__qualname__ = f"{backend}_as_served" if as_served else backend
    entry.__doc__ = (f"PyTorch's {backend} attention on the contract's arguments (either argument order); returns "
                     "(output [B, H, D] bf16, lse [B, H] float32 base 2)"
                     + ("; declared as an engine serves it (no empty sequences)." if as_served else "."))
    entry.returns_lse = True
    entry.waives = ("empty_sequences", "input_validation") if as_served else ("input_validation",)
    entry.for_definition = _for_definition(entry, backend)
    return entry


flash = _entry("flash", as_served=False)
flash_as_served = _entry("flash", as_served=True)
efficient = _entry("efficient", as_served=False)
efficient_as_served = _entry("efficient", as_served=True)
cudnn = _entry("cudnn", as_served=False)
cudnn_as_served = _entry("cudnn", as_served=True)
math = _entry("math", as_served=False)
