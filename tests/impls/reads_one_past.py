"""A planted out-of-bounds reader whose every value is right: before computing (with this project's kernel), a
small Triton kernel reads ``kv_indptr`` one element past its end (the mask ``offs <= n`` where ``offs < n`` was
meant) and stores the sum of what it read in a scratch buffer nobody reads. The sum keeps the read alive: a
first version multiplied the values by 0, the compiler folded the integer product and dropped the load, and
memcheck on the H200 had nothing to see.

No value check can see it: the element read is never used. compute-sanitizer's memcheck can, where the buffer is
an allocation of its own (torch's caching allocator off, ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, and the input a
copy the sanitized child made: ``--sanitize``). GPU only: in the CPU interpreter the read is one past a host
buffer, which nothing checks (and which could fault).
"""

import torch
import triton
import triton.language as tl

from gqa_decode_fuzz.kernel import run as correct


@triton.jit
def _peek_one_past(indptr, scratch, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    values = tl.load(indptr + offs, mask=offs <= n, other=0)  # the planted bug: <= reads indptr[n]
    tl.store(scratch, tl.sum(values, axis=0))  # a scratch value nobody reads: every result stays right


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    if q.device.type == "cuda" and kv_indptr.is_contiguous():
        scratch = torch.empty(1, dtype=kv_indptr.dtype, device=q.device)
        n = kv_indptr.numel()
        _peek_one_past[(1,)](kv_indptr, scratch, n, BLOCK=triton.next_power_of_2(n + 1))
    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
