"""A planted faulting kernel for the crash-containment run on a GPU (docs/gpu.md).

The real kernel, launched without the wrapper's validation, with every page id moved
2**40 pages past the pool when a batch has two or more sequences of 3 tokens or more:
an illegal address on a GPU, a sticky error that poisons the process's CUDA context.
Smaller batches run correctly, so the property suite also has passing examples.
Never run it on CPU: the interpreter does no bounds checking.
"""

import torch

from gqa_decode_fuzz.kernel import _launch
from gqa_decode_fuzz.kernel._kernel import gqa_paged_decode_kernel

FAR = 2**40


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    lengths = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
    if len(lengths) < 2 or min(lengths) < 3 or q.device.type != "cuda":
        return _launch.run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    far = kv_indices.to(torch.int64) + FAR  # int64 page ids: the kernel's offset arithmetic stays 64-bit
    batch = q.shape[0]
    output = torch.empty((batch, 32, 128), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((batch, 32), dtype=torch.float32, device=q.device)
    scale = _launch.DEFAULT_SM_SCALE if sm_scale is None else float(sm_scale)
    gqa_paged_decode_kernel[(batch,)](
        q, k_cache, v_cache, kv_indptr.contiguous(), far, None, scale, output, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        output.stride(0), output.stride(1), output.stride(2),
        lse.stride(0), lse.stride(1),
        NUM_QO_HEADS=32, NUM_KV_HEADS=4, HEAD_DIM=128, PAGE_SIZE=1, BLOCK_H=32, BLOCK_N=_launch.BLOCK_N,
        num_warps=4, num_stages=2,
    )
    return output, lse
