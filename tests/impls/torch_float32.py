"""An independent implementation of the contract in plain torch: float32 math, bf16 output.

It shares no code with the kernel or the oracle, so the property suite passing it
shows the bound raises no false alarm on a different, correct implementation. It reads
every constant from the tensors, so it serves every definition of the family
(``for_definition``), page sizes above 1 included.
"""

import math

import torch


def _attend(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    batch, heads, dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    scale = torch.tensor(1.0 / math.sqrt(dim) if sm_scale is None else sm_scale, dtype=torch.float32)
    output = torch.zeros(batch, heads, dim, dtype=torch.bfloat16, device=q.device)
    lse = torch.full((batch, heads), -math.inf, dtype=torch.float32, device=q.device)
    bounds = kv_indptr.tolist()
    lasts = kv_last_page_len.tolist() if kv_last_page_len is not None else None
    for seq in range(batch):
        pages = kv_indices[bounds[seq]:bounds[seq + 1]].long()
        if pages.numel() == 0:
            continue
        tokens = pages.numel() if lasts is None else (pages.numel() - 1) * page_size + lasts[seq]
        keys = k_cache[pages].reshape(-1, kv_heads, dim)[:tokens].float().repeat_interleave(heads // kv_heads, 1)
        values = v_cache[pages].reshape(-1, kv_heads, dim)[:tokens].float().repeat_interleave(heads // kv_heads, 1)
        logits = torch.einsum("hd,lhd->hl", q[seq].float(), keys) * scale
        lse[seq] = torch.logsumexp(logits, dim=1) / math.log(2.0)
        output[seq] = torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=1), values).to(torch.bfloat16)
    return output, lse


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """Page size 1."""
    return _attend(q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale)


def run_paged(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
    """Pages of several tokens."""
    return _attend(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)


run.for_definition = lambda definition: run_paged if definition.paged else run
