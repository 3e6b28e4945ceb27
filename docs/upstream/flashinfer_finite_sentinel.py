"""FlashInfer 0.3.1, BatchDecodeWithPagedKVCacheWrapper (CUDA-core decode): logits below -5e4 are dropped.

0.3.1 defines ``math::inf`` as ``5e4`` (include/flashinfer/math.cuh); the decode kernel masks with ``-math::inf``
and starts its running maximum there. A head whose every logit (base 2, after sm_scale) lies below -5e4 then
gets output 0 and an LSE pinned near -5e4 instead of its real values, although such logits are finite and
their softmax well defined (known upstream: flashinfer-ai/flashinfer issue 4450).

Input: one sequence of one token, 32 query heads over 4 KV heads, head dim 128, page size 1, bf16, sm_scale 1.
k = -1 everywhere and query head h = a_h everywhere, a_h from 16 to 8192 (bf16 values), so head h's one logit is
exactly -128 a_h: from -2,955 to -1,512,775 in base 2.
Expected: with one token, each head's output is its V row exactly and its LSE (base 2) its logit.

Run (a CUDA GPU; FlashInfer JIT-compiles its decode module on first use)::

    python flashinfer_finite_sentinel.py     # exit 1 when the defect shows, 0 when not
"""

import math
import sys

import flashinfer
import torch

HEADS, KV_HEADS, DIM = 32, 4, 128


def versions() -> None:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, flashinfer {flashinfer.__version__}, "
          f"GPU {torch.cuda.get_device_name()}")


def main() -> int:
    versions()
    dev = "cuda"
    scale = (16 * 2 ** (9 * torch.arange(HEADS, dtype=torch.float64) / (HEADS - 1))).to(torch.bfloat16)
    q = (scale[:, None] * torch.ones(HEADS, DIM)).to(torch.bfloat16)[None].to(dev)  # [1, H, D]
    k_cache = -torch.ones(1, 1, KV_HEADS, DIM, dtype=torch.bfloat16, device=dev)
    v_cache = torch.randn(1, 1, KV_HEADS, DIM, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(dev)
    expected_out = v_cache[0, 0].repeat_interleave(HEADS // KV_HEADS, dim=0).double().cpu()  # [H, D]
    expected_lse = -DIM * scale.double() / math.log(2)  # base 2, exact logits

    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD", use_tensor_cores=False)
    one = torch.ones(1, dtype=torch.int32, device=dev)
    wrapper.plan(torch.tensor([0, 1], dtype=torch.int32, device=dev), torch.zeros(1, dtype=torch.int32, device=dev),
                 one, HEADS, KV_HEADS, DIM, 1, pos_encoding_mode="NONE", q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16, sm_scale=1.0)
    out, lse = wrapper.run(q, (k_cache, v_cache), return_lse=True)
    torch.cuda.synchronize()
    out, lse = out[0].double().cpu(), lse[0].double().cpu()

    print(f"one sequence of 1 token, {HEADS} q heads / {KV_HEADS} KV heads, D={DIM}, page size 1, bf16, sm_scale=1")
    print(f"{'head':>4} {'a_h':>7} {'expected lse':>14} {'actual lse':>14} {'max|out - v|':>13} {'max|v|':>7}  verdict")
    wrong = 0
    for h in range(HEADS):
        out_error = (out[h] - expected_out[h]).abs().max().item()
        lse_error = abs(lse[h].item() - expected_lse[h].item())
        ok = out_error <= 1e-6 and lse_error <= 1e-5 * abs(expected_lse[h].item())
        wrong += not ok
        print(f"{h:>4} {scale[h].item():>7g} {expected_lse[h].item():>14.1f} {lse[h].item():>14.1f} "
              f"{out_error:>13.4g} {expected_out[h].abs().max().item():>7.3g}  {'ok' if ok else 'WRONG'}")
    print(f"DEFECT: {wrong} of {HEADS} heads wrong (logits below about -5e4 in base 2)" if wrong else "not shown")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

# ---- H200 output ----------------------------------------------------------------------------------------------
# 2026-12-03, one NVIDIA H200 (driver image: torch 2.11, CUDA 13.0): `python3 flashinfer_finite_sentinel.py`, exit status 1
#
# torch 2.11.0+cu130, CUDA 13.0, flashinfer 0.3.1, GPU NVIDIA H200
# one sequence of 1 token, 32 q heads / 4 KV heads, D=128, page size 1, bf16, sm_scale=1
# head     a_h   expected lse     actual lse  max|out - v|  max|v|  verdict
#    0      16        -2954.6        -2954.6             0    3.41  ok
#    1  19.625        -3624.0        -3624.0             0    3.41  ok
#    2  23.875        -4408.9        -4408.9             0    3.41  ok
#    3   29.25        -5401.5        -5401.5             0    3.41  ok
#    4   35.75        -6601.8        -6601.8             0    3.41  ok
#    5   43.75        -8079.1        -8079.1             0    3.41  ok
#    6    53.5        -9879.6        -9879.6             0    3.41  ok
#    7    65.5       -12095.6       -12095.6             0    3.41  ok
#    8      80       -14773.2       -14773.2             0    1.95  ok
#    9      98       -18097.2       -18097.2             0    1.95  ok
#   10   119.5       -22067.5       -22067.5             0    1.95  ok
#   11     146       -26961.1       -26961.1             0    1.95  ok
#   12     179       -33055.0       -33055.0             0    1.95  ok
#   13     219       -40441.6       -40441.6             0    1.95  ok
#   14     268       -49490.2       -49490.2             0    1.95  ok
#   15     328       -60570.1       -49997.0         1.953    1.95  WRONG
#   16     400       -73866.0       -49997.0         3.938    3.94  WRONG
#   17     490       -90485.8       -49997.0         3.938    3.94  WRONG
#   18     600      -110799.0       -49997.0         3.938    3.94  WRONG
#   19     732      -135174.8       -49997.0         3.938    3.94  WRONG
#   20     896      -165459.8       -49997.0         3.938    3.94  WRONG
#   21    1096      -202392.8       -49997.0         3.938    3.94  WRONG
#   22    1336      -246712.4       -49997.0         3.938    3.94  WRONG
#   23    1640      -302850.5       -49997.0         3.938    3.94  WRONG
#   24    2000      -369329.9       -49997.0         4.094    4.09  WRONG
#   25    2448      -452059.8       -49997.0         4.094    4.09  WRONG
#   26    2992      -552517.6       -49997.0         4.094    4.09  WRONG
#   27    3664      -676612.4       -49997.0         4.094    4.09  WRONG
#   28    4480      -827299.0       -49997.0         4.094    4.09  WRONG
#   29    5472     -1010486.7       -49997.0         4.094    4.09  WRONG
#   30    6688     -1235039.3       -49997.0         4.094    4.09  WRONG
#   31    8192     -1512775.4       -49997.0         4.094    4.09  WRONG
# DEFECT: 17 of 32 heads wrong (logits below about -5e4 in base 2)
