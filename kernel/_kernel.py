"""The Triton kernel: GQA decode over a paged KV cache, for any head counts, head dim and page size.

One program handles every query head of one sequence, so that the query heads form
the M dimension of ``tl.dot``. M must be a power of two of at least 16, so the heads
are padded to ``BLOCK_H`` rows; the padded rows are masked on the one load of q and
on the stores, and they never join a dot (a padded row h >= NUM_QO_HEADS maps to KV
head h // GROUP >= NUM_KV_HEADS, which no KV head matches). A query head h reads KV
head h // GROUP; the dots run once per KV head with the other heads' rows zeroed.

Token t of a sequence lives in slot t % PAGE_SIZE of page
``kv_indices[kv_indptr[b] + t // PAGE_SIZE]``; a sequence holds ``(pages - 1) *
PAGE_SIZE + kv_last_page_len[b]`` tokens, and the unused slots of its last page are
never read. With ``PAGE_SIZE == 1`` the divisions fold away at compile time and
``kv_last_page_len`` is not an argument (a page is a token).

Differences from the seed kernel (each a defect the property suite finds in it):
addresses are computed in int64 (``page_id * stride`` overflows int32 once page
ids reach 2**22 with one-token pages, 2**16 with 64-token pages; a head- or
dim-major pool of millions of pages overflows it in ``head * stride`` or ``dim *
stride`` too), and every stride is read, the last dimension's included, so sliced
and strided inputs give the right answer.
"""

import triton
import triton.language as tl


@triton.jit
def gqa_paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr,
    kv_indptr_ptr, kv_indices_ptr, kv_last_page_len_ptr,
    sm_scale,
    output_ptr, lse_ptr,
    stride_q_b, stride_q_h, stride_q_d,
    stride_k_page, stride_k_slot, stride_k_head, stride_k_d,
    stride_v_page, stride_v_slot, stride_v_head, stride_v_d,
    stride_o_b, stride_o_h, stride_o_d,
    stride_lse_b, stride_lse_h,
    NUM_QO_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    LOG2E: tl.constexpr = 1.4426950408889634
    GROUP: tl.constexpr = NUM_QO_HEADS // NUM_KV_HEADS
    seq = tl.program_id(0).to(tl.int64)

    page_start = tl.load(kv_indptr_ptr + seq).to(tl.int64)
    num_pages = tl.load(kv_indptr_ptr + seq + 1).to(tl.int64) - page_start
    if PAGE_SIZE == 1:
        seq_len = num_pages
    else:
        last_len = tl.load(kv_last_page_len_ptr + seq).to(tl.int64)
        seq_len = tl.where(num_pages > 0, (num_pages - 1) * PAGE_SIZE + last_len, 0)

    # int64 offsets make every address product int64, whatever the strides' types.
    offs_h = tl.arange(0, BLOCK_H).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM).to(tl.int64)
    kv_head_of_q = offs_h // GROUP
    # Rows past NUM_QO_HEADS only pad tl.dot's M: masked on the load of q and on every store. Without
    # padding the mask is a constant, which the compiler drops: the seed's compiled kernel is unchanged.
    if BLOCK_H == NUM_QO_HEADS:
        is_head = tl.full([BLOCK_H], 1, tl.int1)
    else:
        is_head = offs_h < NUM_QO_HEADS
    out_ptrs = output_ptr + seq * stride_o_b + offs_h[:, None] * stride_o_h + offs_d[None, :] * stride_o_d
    lse_ptrs = lse_ptr + seq * stride_lse_b + offs_h * stride_lse_h

    if seq_len == 0:
        tl.store(out_ptrs, tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32).to(output_ptr.dtype.element_ty),
                 mask=is_head[:, None])
        tl.store(lse_ptrs, tl.full([BLOCK_H], float("-inf"), dtype=tl.float32), mask=is_head)
        return

    q = tl.load(q_ptr + seq * stride_q_b + offs_h[:, None] * stride_q_h + offs_d[None, :] * stride_q_d,
                mask=is_head[:, None], other=0.0)
    q = q.to(tl.float32)

    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)

    offs_n = tl.arange(0, BLOCK_N)
    for block_start in range(0, seq_len, BLOCK_N):
        token = block_start + offs_n
        in_seq = token < seq_len
        page = tl.load(kv_indices_ptr + page_start + token // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)
        slot = token % PAGE_SIZE
        # Each token's offset into the K and V pools, once per block; a KV head and a dim add theirs.
        k_token = page * stride_k_page + slot * stride_k_slot
        v_token = page * stride_v_page + slot * stride_v_slot

        scores = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
        for g in range(NUM_KV_HEADS):
            k = tl.load(
                k_cache_ptr + k_token[:, None] + tl.cast(g, tl.int64) * stride_k_head + offs_d[None, :] * stride_k_d,
                mask=in_seq[:, None], other=0.0,
            )
            q_g = tl.where((kv_head_of_q == g)[:, None], q, 0.0)
            scores += tl.dot(q_g, tl.trans(k.to(tl.float32)))
        scores = tl.where(in_seq[None, :], scores * sm_scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2((m_i - m_new) * LOG2E)
        p = tl.exp2((scores - m_new[:, None]) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        p_bf16 = p.to(tl.bfloat16)
        for g in range(NUM_KV_HEADS):
            v = tl.load(
                v_cache_ptr + v_token[:, None] + tl.cast(g, tl.int64) * stride_v_head + offs_d[None, :] * stride_v_d,
                mask=in_seq[:, None], other=0.0,
            )
            p_g = tl.where((kv_head_of_q == g)[:, None], p_bf16, 0.0)
            acc += tl.dot(p_g, v)
        m_i = m_new

    tl.store(out_ptrs, (acc / l_i[:, None]).to(output_ptr.dtype.element_ty), mask=is_head[:, None])
    tl.store(lse_ptrs, m_i * LOG2E + tl.log2(l_i), mask=is_head)
