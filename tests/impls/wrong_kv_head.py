"""The hostile panel's wrong kernel: query head h reads KV head h % 4 instead of h // 8 (plain torch).

Every ``hostile_*.py`` plants a cheat on it; the suite must find each of them red (tests/test_isolation.py).
``correct`` is the right answer (``torch_float32``), for cheats that show it to the suite while serving this.
"""

import math

import torch

from tests.impls.torch_float32 import run as correct

__all__ = ["correct", "run"]

WRONG_KV_HEAD = torch.arange(32) % 4  # the right map is torch.arange(32) // 8


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    scale = 1.0 / math.sqrt(128) if sm_scale is None else float(sm_scale)
    batch = q.shape[0]
    output = torch.zeros(batch, 32, 128, dtype=torch.bfloat16, device=q.device)
    lse = torch.full((batch, 32), -math.inf, dtype=torch.float32, device=q.device)
    bounds = kv_indptr.tolist()
    heads = WRONG_KV_HEAD.to(q.device)
    for seq in range(batch):
        pages = kv_indices[bounds[seq]:bounds[seq + 1]].long()
        if pages.numel() == 0:
            continue
        keys = k_cache[pages, 0].float()[:, heads]  # [L, 32, 128]
        values = v_cache[pages, 0].float()[:, heads]
        logits = torch.einsum("hd,lhd->hl", q[seq].float(), keys) * scale
        lse[seq] = torch.logsumexp(logits, dim=1) / math.log(2.0)
        output[seq] = torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=1), values).to(torch.bfloat16)
    return output, lse
