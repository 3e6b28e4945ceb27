"""Compile the kernel's seed launch for an H200 (sm_90) on any machine, no GPU needed, and count its PTX instructions.

    python benchmarks/kernel_ptx.py                          # this tree's kernel: instruction counts
    python benchmarks/kernel_ptx.py --baseline=old/kernel    # and the counts that differ from another copy's

The launch is the seed's (32 query heads, 4 KV heads, head dim 128, page size 1, BLOCK_N 128, 4 warps, 2 stages)
with contiguous inputs, so its unit strides specialise to 1 as Triton does at launch. Equal counts mean the same
compiled kernel up to register names: the check that a change to the family kernel left the seed's alone.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.kernel_speed import load_package  # noqa: E402

CONSTANTS = {"NUM_QO_HEADS": 32, "NUM_KV_HEADS": 4, "HEAD_DIM": 128, "PAGE_SIZE": 1, "BLOCK_H": 32, "BLOCK_N": 128,
             "kv_last_page_len_ptr": None, "stride_q_d": 1, "stride_k_d": 1, "stride_v_d": 1, "stride_o_d": 1,
             "stride_lse_h": 1}
POINTERS = {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "output_ptr": "*bf16",
            "lse_ptr": "*fp32", "kv_indptr_ptr": "*i32", "kv_indices_ptr": "*i32"}
_OPCODE = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)", re.MULTILINE)


def seed_ptx(package) -> str:
    """The PTX of ``package``'s kernel for the seed launch on sm_90 (takes the arguments its kernel declares)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = package._kernel.gqa_paged_decode_kernel
    names = kernel.arg_names
    constants = {name: value for name, value in CONSTANTS.items() if name in names}
    signature = {name: "constexpr" if name in constants else POINTERS.get(name, "fp32" if name == "sm_scale" else "i32")
                 for name in names}
    aligned = {(names.index(name),): [["tt.divisibility", 16]] for name in POINTERS if name in names}
    compiled = triton.compile(ASTSource(kernel, signature, constants, aligned), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "num_stages": 2})
    return compiled.asm["ptx"]


def opcode_counts(ptx: str) -> collections.Counter:
    """Instructions by opcode (predicated ones as ``@opcode``)."""
    return collections.Counter(("@" if line.lstrip().startswith("@") else "") + match.group(1)
                               for line in ptx.splitlines() for match in [_OPCODE.match(line)] if match)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another copy of the kernel/ package to compare with")
    args = parser.parse_args(argv)
    ours = opcode_counts(seed_ptx(load_package(ROOT / "kernel", "kernel")))
    print(f"this tree: {sum(ours.values())} instructions, {len(ours)} opcodes")
    if not args.baseline:
        for opcode, count in ours.most_common():
            print(f"{count:6d}  {opcode}")
        return 0
    theirs = opcode_counts(seed_ptx(load_package(args.baseline.resolve(), "gqa_kernel_baseline")))
    print(f"baseline: {sum(theirs.values())} instructions, {len(theirs)} opcodes")
    differ = sorted(opcode for opcode in set(ours) | set(theirs) if ours[opcode] != theirs[opcode])
    for opcode in differ:
        print(f"{opcode}: baseline {theirs[opcode]}, this tree {ours[opcode]}")
    print("same instruction counts" if not differ else f"{len(differ)} opcodes differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
