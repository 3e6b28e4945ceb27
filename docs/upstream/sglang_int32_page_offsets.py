"""SGLang 0.5.23, Triton decode attention (``decode_attention_fwd``, grouped path): int32 page offsets overflow.

Stage 1 loads each token's slot from ``kv_indices`` and multiplies it by the K/V buffer's token stride
(``kv_loc[None, :] * stride_buf_kbs``, sglang/kernels/ops/attention/decode_attention.py) in the index's own
dtype. The kernel accepts int32 ``kv_indices``; with them the product wraps at 2^31 elements, i.e. from slot
2^31 / (KV heads * head dim) on: 4,194,304 for 4 KV heads of 128. SGLang's own backend passes int64 indices,
where it does not wrap; a caller with int32 page tables (as FlashInfer-style callers have) reads out of bounds.

Input: one sequence of one token, 32 query heads over 4 KV heads, head dim 128, page size 1, bf16, a token pool
of P slots whose last slot (P - 1) holds the token.
  case 1 (the minimal case found): P = 2^22 + 1, slot 2^22: the offset wraps to -2^31: illegal memory access
         (run in a child process, since the fault ends the CUDA context).
  case 2: P = 2^23 + 1, slot 2^23: the offset wraps to exactly 0, so slot 0 is read instead: a silent wrong
         answer. The same call with int64 indices is the control.
Expected: with one token, each head's output is its KV head's V row of that slot.
Memory: 8.6 GB (case 1) and 17.2 GB (case 2) of K and V.

How SGLang is imported: the kernel file only, by path, without running sglang/__init__.py (which needs the
server's dependencies): parent packages as empty modules, ``sglang.srt.utils`` as a stub with the four names the
kernel file imports. Put the sglang 0.5.23 wheel's files on PYTHONPATH (or install it with --no-deps).

Run (a CUDA GPU)::

    python sglang_int32_page_offsets.py     # exit 1 when the defect shows, 0 when not
"""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import types

import torch

HEADS, KV_HEADS, DIM = 32, 4, 128
KERNEL = "sglang.kernels.ops.attention.decode_attention"


def load_kernel_module():
    """The decode kernel module, loaded from its file with stub parent packages and a stub sglang.srt.utils."""
    root = list(importlib.util.find_spec("sglang").submodule_search_locations)[0]
    parts = KERNEL.split(".")
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *parts[1:depth])]
        sys.modules[name] = package
    srt = types.ModuleType("sglang.srt")
    srt.__path__ = [os.path.join(root, "srt")]
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_hip = lambda: torch.version.hip is not None
    utils.is_gfx95_supported = utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count
    sys.modules.update({"sglang.srt": srt, "sglang.srt.utils": utils})
    spec = importlib.util.spec_from_file_location(KERNEL, os.path.join(root, *parts[1:]) + ".py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[KERNEL] = module
    spec.loader.exec_module(module)
    return module


def versions() -> None:
    try:
        sglang_version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        sglang_version = "unknown (no package metadata)"
    import triton
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, sglang {sglang_version}, "
          f"triton {triton.__version__}, GPU {torch.cuda.get_device_name()}")


def decode(kernel, pool_slots: int, index_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output [1, H, D], the V row of the token's slot, the V row of slot 0) for one token at slot pool_slots - 1."""
    dev = "cuda"
    slot = pool_slots - 1
    k_buffer = torch.zeros(pool_slots, KV_HEADS, DIM, dtype=torch.bfloat16, device=dev)
    v_buffer = torch.zeros(pool_slots, KV_HEADS, DIM, dtype=torch.bfloat16, device=dev)
    g = torch.Generator().manual_seed(0)
    v_buffer[slot] = torch.randn(KV_HEADS, DIM, generator=g).to(torch.bfloat16).to(dev)
    v_buffer[0] = torch.randn(KV_HEADS, DIM, generator=g).to(torch.bfloat16).to(dev)
    q = torch.randn(1, HEADS, DIM, generator=g).to(torch.bfloat16).to(dev)
    out = torch.empty_like(q)
    max_splits = 8
    attn_logits = torch.empty(1, HEADS, max_splits, DIM, dtype=torch.float32, device=dev)
    attn_lse = torch.empty(1, HEADS, max_splits, dtype=torch.float32, device=dev)
    kernel.decode_attention_fwd(
        q, k_buffer, v_buffer, out, torch.tensor([0, 1], dtype=torch.int32, device=dev),
        torch.tensor([slot], dtype=index_dtype, device=dev), attn_logits, attn_lse,
        torch.ones(1, dtype=torch.int32, device=dev), max_splits, DIM**-0.5, 1.0, 1.0)
    torch.cuda.synchronize()
    return out.cpu(), v_buffer[slot].cpu(), v_buffer[0].cpu()


def expected_rows(v_row: torch.Tensor) -> torch.Tensor:
    return v_row.repeat_interleave(HEADS // KV_HEADS, dim=0)[None]  # [1, H, D]


def crash_case() -> int:
    """Case 1, in its own process: print what happens and return 0 if the call came back right."""
    out, v_row, _ = decode(load_kernel_module(), 2**22 + 1, torch.int32)
    right = torch.allclose(out.float(), expected_rows(v_row).float(), atol=1e-2, rtol=1e-2)
    print(f"  child: the call returned; output {'right' if right else 'WRONG'}")
    return 0 if right else 1


def main() -> int:
    versions()
    print(f"one sequence of 1 token, {HEADS} q heads / {KV_HEADS} KV heads, D={DIM}, page size 1, bf16")
    print("case 1: slot 2^22 = 4194304 in a pool of 2^22 + 1 slots, int32 kv_indices (in a child process)")
    child = subprocess.run([sys.executable, __file__, "--case-1"], capture_output=True, text=True, timeout=240)
    lines = (child.stdout + child.stderr).strip().splitlines()
    errors = [line for line in lines if "illegal memory access" in line or "Error" in line]
    print(f"  child exit status {child.returncode}; {(errors or lines or ['(no output)'])[-1].strip()[:300]}")
    crashed = child.returncode != 0

    kernel = load_kernel_module()
    print("case 2: slot 2^23 = 8388608 in a pool of 2^23 + 1 slots")
    wrong = False
    for dtype in (torch.int64, torch.int32):
        out, v_row, v_zero = decode(kernel, 2**23 + 1, dtype)
        right = torch.allclose(out.float(), expected_rows(v_row).float(), atol=1e-2, rtol=1e-2)
        slot_zero = torch.allclose(out.float(), expected_rows(v_zero).float(), atol=1e-2, rtol=1e-2)
        error = (out.float() - expected_rows(v_row).float()).abs().max().item()
        print(f"  kv_indices {str(dtype):>11}: max |out - expected| {error:.3g}; output "
              f"{'right' if right else 'WRONG'}{' (it is slot 0 V row)' if slot_zero else ''}")
        wrong |= dtype == torch.int32 and not right
        torch.cuda.empty_cache()
    defect = crashed or wrong
    print("DEFECT: int32 kv_indices from slot 2^31 / (KV heads * head dim) on: "
          f"{'an illegal memory access' if crashed else ''}{' and ' if crashed and wrong else ''}"
          f"{'slot 0 read instead' if wrong else ''}" if defect else "not shown")
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(crash_case() if sys.argv[1:] == ["--case-1"] else main())

# ---- H200 output ----------------------------------------------------------------------------------------------
# 2026-12-03, one NVIDIA H200 (driver image: torch 2.11, CUDA 13.0): `python3 sglang_int32_page_offsets.py`, exit status 1
#
# torch 2.11.0+cu130, CUDA 13.0, sglang 0.5.23, triton 3.6.0, GPU NVIDIA H200
# one sequence of 1 token, 32 q heads / 4 KV heads, D=128, page size 1, bf16
# case 1: slot 2^22 = 4194304 in a pool of 2^22 + 1 slots, int32 kv_indices (in a child process)
#   child exit status 1; RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered
# case 2: slot 2^23 = 8388608 in a pool of 2^23 + 1 slots
#   kv_indices torch.int64: max |out - expected| 0; output right
#   kv_indices torch.int32: max |out - expected| 5.02; output WRONG (it is slot 0 V row)
# DEFECT: int32 kv_indices from slot 2^31 / (KV heads * head dim) on: an illegal memory access and slot 0 read instead
