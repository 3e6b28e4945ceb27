"""FlashInfer 0.3.1, BatchDecodeWithPagedKVCacheWrapper.run: the output is written contiguous whatever its strides.

``run`` allocates ``out = torch.empty_like(q)`` (flashinfer/decode.py), which keeps q's strides when q is a dense
permuted tensor, and checks a caller's ``out=`` for shape, dtype and device only. The CUDA-core decode kernel
reads q through its strides (``q_stride_n``, ``q_stride_h``) but stores the output at
``(batch_idx * num_qo_heads + head) * head_dim`` (include/flashinfer/attention/decode.cuh), i.e. as a contiguous
[batch, heads, dim] tensor. With a q whose heads are the outer dimension the answer lands in the wrong elements:
a silent wrong result from batch 2 on (with batch 1 both orders agree).

Input: two sequences of one token each, 32 query heads over 4 KV heads, head dim 128, page size 1, bf16;
q = torch.randn(heads, batch, dim).transpose(0, 1) (shape [batch, heads, dim], strides (dim, batch*dim, 1)).
Expected: with one token, the output of each head is its KV head's V row, exactly.

Run (a CUDA GPU; FlashInfer JIT-compiles its decode module on first use)::

    python flashinfer_output_strides.py     # exit 1 when the defect shows, 0 when not
"""

import sys

import flashinfer
import torch

HEADS, KV_HEADS, DIM, BATCH = 32, 4, 128, 2


def versions() -> None:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, flashinfer {flashinfer.__version__}, "
          f"GPU {torch.cuda.get_device_name()}")


def mismatches(name: str, out: torch.Tensor, expected: torch.Tensor) -> int:
    wrong = int((out.float() != expected.float()).sum())
    print(f"{name}: out.stride()={tuple(out.stride())}, {wrong} of {out.numel()} elements differ from the expected")
    return wrong


def main() -> int:
    versions()
    dev = "cuda"
    g = torch.Generator().manual_seed(0)
    k_cache = torch.randn(BATCH, 1, KV_HEADS, DIM, generator=g).to(torch.bfloat16).to(dev)  # page b: sequence b
    v_cache = torch.randn(BATCH, 1, KV_HEADS, DIM, generator=g).to(torch.bfloat16).to(dev)
    q_heads_outer = torch.randn(HEADS, BATCH, DIM, generator=g).to(torch.bfloat16).to(dev).transpose(0, 1)
    expected = v_cache[:, 0].repeat_interleave(HEADS // KV_HEADS, dim=1)  # [B, H, D]: each head's one V row

    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD", use_tensor_cores=False)
    indptr = torch.arange(BATCH + 1, dtype=torch.int32, device=dev)
    indices = torch.arange(BATCH, dtype=torch.int32, device=dev)
    last_page_len = torch.ones(BATCH, dtype=torch.int32, device=dev)
    wrapper.plan(indptr, indices, last_page_len, HEADS, KV_HEADS, DIM, 1, pos_encoding_mode="NONE",
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    print(f"q: shape {tuple(q_heads_outer.shape)}, strides {tuple(q_heads_outer.stride())} "
          f"(dense, heads outer); {BATCH} sequences of 1 token, {HEADS} q heads / {KV_HEADS} KV heads, D={DIM}")

    control = wrapper.run(q_heads_outer.contiguous(), (k_cache, v_cache))
    out = wrapper.run(q_heads_outer, (k_cache, v_cache))
    given = torch.empty(HEADS, BATCH, DIM, dtype=torch.bfloat16, device=dev).transpose(0, 1)
    wrapper.run(q_heads_outer, (k_cache, v_cache), out=given)
    torch.cuda.synchronize()
    wrong_control = mismatches("q.contiguous() (control)", control, expected)
    wrong = mismatches("q as given, out allocated by run", out, expected)
    wrong_given = mismatches("q as given, out= a heads-outer tensor", given, expected)
    as_stored = torch.as_strided(out, (BATCH, HEADS, DIM), (HEADS * DIM, DIM, 1))
    print(f"out's memory read as a contiguous [batch, heads, dim] tensor equals the expected: "
          f"{bool(torch.equal(as_stored, expected))}")
    defect = wrong_control == 0 and (wrong > 0 or wrong_given > 0)
    print("DEFECT: the output lands in the wrong elements when it is not contiguous" if defect else "not shown")
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(main())

# ---- H200 output ----------------------------------------------------------------------------------------------
# 2026-12-03, one NVIDIA H200 (driver image: torch 2.11, CUDA 13.0): `python3 flashinfer_output_strides.py`, exit status 1
#
# torch 2.11.0+cu130, CUDA 13.0, flashinfer 0.3.1, GPU NVIDIA H200
# q: shape (2, 32, 128), strides (128, 256, 1) (dense, heads outer); 2 sequences of 1 token, 32 q heads / 4 KV heads, D=128
# q.contiguous() (control): out.stride()=(4096, 128, 1), 0 of 8192 elements differ from the expected
# q as given, out allocated by run: out.stride()=(128, 256, 1), 7160 of 8192 elements differ from the expected
# q as given, out= a heads-outer tensor: out.stride()=(128, 256, 1), 7160 of 8192 elements differ from the expected
# out's memory read as a contiguous [batch, heads, dim] tensor equals the expected: True
# DEFECT: the output lands in the wrong elements when it is not contiguous
