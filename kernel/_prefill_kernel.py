"""The Triton kernel: causal GQA prefill over a paged KV cache or ragged K and V.

One program per (sequence, tile of query rows, KV head). The rows of a tile are the
sequence's (query token, query head) pairs of one KV head's group, flattened token-major:
row r is token r // GROUP, query head kv_head * GROUP + r % GROUP. A tile holds BLOCK_M
rows whatever the group (5 and 6 heads included), so no row is padding but the last
tile's tail, masked on the one load of q and on the stores.

Causal, bottom-right aligned: in a sequence of q_len queries over kv_len keys, query i sees
keys j <= i + kv_len - q_len. A tile loops over key blocks up to its last row's limit, and
each row masks the keys past its own with -inf (never a finite sentinel: every finite
float32 logit keeps its weight). A row that sees no key keeps its running max at -inf;
the exponentials then use 0 as the reference, so nothing is NaN, and the row stores output
0 and LSE -inf exactly.

Key j of a sequence lives, paged, in slot j % PAGE_SIZE of page
``kv_indices[kv_indptr[b] + j // PAGE_SIZE]`` (a sequence holds ``(pages - 1) * PAGE_SIZE +
kv_last_page_len[b]`` keys; the unused slots of its last page are never read), and ragged
in row ``kv_indptr[b] + j`` of K and V (the page stride is the token stride there). As in the
decode kernel, every stride is read and every address is formed in int64.
"""

import triton
import triton.language as tl


@triton.jit
def gqa_causal_prefill_kernel(
    q_ptr, k_ptr, v_ptr,
    qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_last_page_len_ptr,
    sm_scale,
    output_ptr, lse_ptr,
    stride_q_t, stride_q_h, stride_q_d,
    stride_k_page, stride_k_slot, stride_k_head, stride_k_d,
    stride_v_page, stride_v_slot, stride_v_head, stride_v_d,
    stride_o_t, stride_o_h, stride_o_d,
    stride_lse_t, stride_lse_h,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    RAGGED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    LOG2E: tl.constexpr = 1.4426950408889634
    seq = tl.program_id(0).to(tl.int64)
    first_row = tl.program_id(1).to(tl.int64) * BLOCK_M
    kv_head = tl.program_id(2).to(tl.int64)

    q_start = tl.load(qo_indptr_ptr + seq).to(tl.int64)
    q_len = tl.load(qo_indptr_ptr + seq + 1).to(tl.int64) - q_start
    if first_row >= q_len * GROUP:  # the grid covers the longest sequence's tiles
        return
    kv_start = tl.load(kv_indptr_ptr + seq).to(tl.int64)
    kv_count = tl.load(kv_indptr_ptr + seq + 1).to(tl.int64) - kv_start
    if RAGGED or PAGE_SIZE == 1:
        kv_len = kv_count
    else:
        last_len = tl.load(kv_last_page_len_ptr + seq).to(tl.int64)
        kv_len = tl.where(kv_count > 0, (kv_count - 1) * PAGE_SIZE + last_len, 0)

    rows = first_row + tl.arange(0, BLOCK_M).to(tl.int64)
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    is_row = token < q_len
    # Keys j < limit are the row's (bottom-right alignment); limit <= kv_len for every real row.
    limit = token + (kv_len - q_len) + 1
    last_token = tl.minimum((first_row + BLOCK_M - 1) // GROUP, q_len - 1)
    key_end = tl.minimum(kv_len, last_token + (kv_len - q_len) + 1)  # the tile's last row's limit; may be <= 0

    offs_d = tl.arange(0, HEAD_DIM).to(tl.int64)
    q = tl.load(q_ptr + (q_start + token)[:, None] * stride_q_t + head[:, None] * stride_q_h
                + offs_d[None, :] * stride_q_d, mask=is_row[:, None], other=0.0)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    for block_start in range(0, key_end, BLOCK_N):
        key = block_start + offs_n
        in_range = key < key_end
        if RAGGED:
            k_token = (kv_start + key) * stride_k_page
            v_token = (kv_start + key) * stride_v_page
        else:
            page = tl.load(kv_indices_ptr + kv_start + key // PAGE_SIZE, mask=in_range, other=0).to(tl.int64)
            slot = key % PAGE_SIZE
            k_token = page * stride_k_page + slot * stride_k_slot
            v_token = page * stride_v_page + slot * stride_v_slot
        k = tl.load(k_ptr + k_token[:, None] + kv_head * stride_k_head + offs_d[None, :] * stride_k_d,
                    mask=in_range[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * sm_scale
        visible = (key[None, :] < limit[:, None]) & in_range[None, :]
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf) = 0, not NaN
        alpha = tl.exp2((m_i - m_ref) * LOG2E)
        p = tl.exp2((scores - m_ref[:, None]) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + v_token[:, None] + kv_head * stride_v_head + offs_d[None, :] * stride_v_d,
                    mask=in_range[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    seen = m_i > float("-inf")
    output = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(seen, m_i * LOG2E + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    out_rows = (q_start + token) * stride_o_t + head * stride_o_h
    tl.store(output_ptr + out_rows[:, None] + offs_d[None, :] * stride_o_d,
             output.to(output_ptr.dtype.element_ty), mask=is_row[:, None])
    tl.store(lse_ptr + (q_start + token) * stride_lse_t + head * stride_lse_h, lse, mask=is_row)
