"""The kernel serves every definition of the family, and checks the paged call as strictly as the seed's.

``for_definition(d)`` is compared with the float32 reference inside each built-in definition file (independent of
the suite's float64 oracle) on cases of the suite's builder: ragged batches with empty sequences, shuffled page
ids, NaN junk in the pages no sequence references and in the unused slots of last pages, strided q, K and V. The
tolerance is derived in ``_output_bound``, not tuned.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gqa_decode_fuzz.generation.cases import DecodeCase, build
from gqa_decode_fuzz.reference.compare import compare_all, raise_if_any
from gqa_decode_fuzz.reference.definitions import BUILT_IN, SEED, Definition, load, register

PAGED = BUILT_IN["gqa_paged_decode_h20_kv4_d128_ps64"]
# Beyond the built-in family: the suite's file definition (eight 16-token pages per block of 128 tokens), and pages
# longer than a block (a block boundary inside a page) with 8 query heads padded to 16, one per KV head, head dim 64.
# The paged reference reads its shapes from the tensors, so it serves these too.
FAMILY = [*BUILT_IN.values(), load("definitions/gqa_paged_decode_h16_kv2_d128_ps16.json", Path(__file__).parent),
          register(Definition("gqa_paged_decode_h8_kv8_d64_ps256", 8, 8, 64, 256, reference=PAGED.reference))]
# Ragged batches with an empty sequence, shuffled page ids, NaN in the spare pages and in the unused slots of
# last pages (the builder leaves them junk). With 64-token pages the lengths put 3, 64 (a full page), 1, 8 and 1
# tokens in last pages, over one to four pages; 200 tokens take two blocks of 128, and peaky keys make a later
# block raise the running max. Strided: q dim-major or a slice of a fused QKV tensor, V head-major or K and V
# dim-major, int64 strided indices.
CASES = [
    DecodeCase(lengths=(3, 0, 64, 65), spare_pages=5, seed=1),
    DecodeCase(lengths=(200, 0, 1), spare_pages=3, scale=0.07, values="peaky", q_layout="dim_outer",
               kv_layout="mixed", seed=2),
    DecodeCase(lengths=(1, 129), spare_pages=2, q_layout="fused_qkv", kv_layout="dim_outer",
               index_layout="int64_strided", seed=3),
]
# Both outputs are within 2**-8 of what they round; the float32 steps (128-term dots, sums of a few hundred
# weights) stay below 2**-14 of the same terms: a margin of 2**-6 on 2**-8.
MARGIN = 1 + 2.0**-6
# LSE, base 2: both in float32, and below 32 in these cases: a few of its ulps (2**-18 each), the dots' rounding
# (about 1e-6 at these logits) and a logsumexp of L terms (about L * 2**-24) stay far below 2**-12.
LSE_BOUND = 2.0**-12


def _for_definition():
    from gqa_decode_fuzz.kernel import (
        for_definition,  # imported after the device fixture has switched the interpreter on (CPU)
    )

    return for_definition


def _reference(definition):
    namespace = {}
    exec(definition.reference, namespace)  # the definition file's own float32 run()
    return namespace["run"]


def _output_bound(expected, args, reference, scale) -> torch.Tensor:
    """How far a correct kernel that rounds P to bf16 before P @ V (as this one does) may land from the reference.

    Each side rounds its result to bf16, within 2**-8 of it (so the kernel's within 2**-8 of about |expected|);
    the kernel's bf16 P moves its output by at most 2**-8 * sum_t w_t |v_t|, the reference's own output for |V|
    (``weighted``). Only the reference's values enter it: a NaN output fails, whatever the bound.
    """
    weighted = reference(args[0], args[1], args[2].abs(), *args[3:], scale)[0]
    return 2.0**-8 * MARGIN * (2 * expected.double().abs() + weighted.double()) * MARGIN


@pytest.mark.parametrize("definition", [pytest.param(d, id=d.name) for d in FAMILY])
def test_each_definition_matches_its_reference(definition, device):
    kernel, reference = _for_definition()(definition), _reference(definition)
    for case in CASES:
        case = replace(case, definition=definition.name)
        *args, scale = build(case, device).arguments()
        output, lse = kernel(*args, scale)
        scale = definition.default_sm_scale if scale is None else scale
        expected, expected_lse = reference(*args, scale)
        mismatches = compare_all([
            ("output", output, expected.double(), _output_bound(expected, args, reference, scale)),
            ("lse", lse, expected_lse.double(), torch.full_like(expected_lse, LSE_BOUND, dtype=torch.float64)),
        ])
        raise_if_any(mismatches, f"{case}")
        empty = [b for b, n in enumerate(case.lengths) if n == 0]  # exactly 0 and -inf (the bound passes only -inf)
        assert not output[empty].float().abs().sum(), f"empty sequences' output is not 0: {output[empty]}"
        assert bool((lse[empty] == -math.inf).all()), f"empty sequences' lse is not -inf: {lse[empty]}"


def test_the_seed_definition_is_run_itself():
    import kernel

    assert kernel.run.for_definition is kernel.for_definition
    assert kernel.for_definition(SEED) is kernel.run
    assert kernel.for_definition(PAGED) is kernel.for_definition(PAGED)


@pytest.mark.parametrize("definition", [pytest.param(d, id=d.name) for d in BUILT_IN.values()])
def test_each_served_function_takes_its_definitions_arguments(definition):
    from gqa_decode_fuzz.kernel import for_definition

    parameters = inspect.signature(for_definition(definition)).parameters
    assert tuple(parameters) == definition.arguments
    assert parameters["sm_scale"].default is None


@pytest.mark.parametrize(("change", "reason"), [
    ({"head_dim": 96}, "head_dim=96 is not a power of two"),
    ({"head_dim": 8}, "head_dim=8 is not a power of two in \\[16, 256\\]"),
    ({"num_qo_heads": 30}, "num_qo_heads=30 is not a multiple of num_kv_heads=4"),
    ({"num_qo_heads": 256, "num_kv_heads": 8}, "num_qo_heads=256 is more than the 128"),
    ({"page_size": 0}, "page_size=0 must be a positive integer"),
])
def test_shapes_the_kernel_cannot_compile_are_refused_naming_the_definition(change, reason):
    from gqa_decode_fuzz.kernel import for_definition

    fields = {"name": "my_decode", "num_qo_heads": 32, "num_kv_heads": 4, "head_dim": 128, "page_size": 16, **change}
    with pytest.raises(ValueError, match=f"definition 'my_decode' is not supported by this kernel: {reason}"):
        for_definition(SimpleNamespace(**fields, paged=fields["page_size"] > 1))


def _paged_call(device) -> list:
    """A valid call of PAGED, sm_scale left out: sequences of 3, 0 and 65 tokens in a pool of 8 pages."""
    return list(build(DecodeCase(lengths=(3, 0, 65), spare_pages=5, definition=PAGED.name), device).arguments())[:-1]


@pytest.mark.parametrize(("argument", "value", "error", "message"), [
    (5, [3, 0, 1], TypeError, "kv_last_page_len must be a torch.Tensor, got list"),
    (5, torch.tensor([3, 0, 1], dtype=torch.float32), TypeError, "kv_last_page_len must have dtype torch.int32"),
    (5, torch.tensor([3, 0, 1, 1], dtype=torch.int32), ValueError,
     r"kv_last_page_len must have shape \[3\], got \[4\]"),
    (5, torch.tensor([65, 0, 1], dtype=torch.int32), ValueError,
     r"kv_last_page_len must lie in \[0, 64\] \(tokens in each sequence's last page\), got values in \[0, 65\]"),
    (5, torch.tensor([3, 0, -1], dtype=torch.int32), ValueError, r"must lie in \[0, 64\].*got values in \[-1, 3\]"),
    (5, torch.tensor([3, 0, 0], dtype=torch.int32), ValueError,
     "kv_last_page_len\\[2\\]=0 but sequence 2 has pages: its last page must hold 1..64 tokens"),
    (5, torch.tensor([3, 0, 1], dtype=torch.int32, device="meta"), ValueError,
     "kv_last_page_len is on meta but q is on"),
    (1, torch.zeros((8, 1, 4, 128), dtype=torch.bfloat16), ValueError,
     r"k_cache must have shape \[\*, 64, 4, 128\], got \[8, 1, 4, 128\]"),
    (2, torch.zeros((5, 64, 4, 128), dtype=torch.bfloat16), ValueError,
     r"v_cache must have shape \[8, 64, 4, 128\], got \[5, 64, 4, 128\]"),
])
def test_a_bad_paged_call_is_refused_naming_the_argument(device, argument, value, error, message):
    from gqa_decode_fuzz.kernel import for_definition

    args = _paged_call(device)
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        value = value.to(device)
    args[argument] = value
    with pytest.raises(error, match=message):
        for_definition(PAGED)(*args)


def test_a_sequence_without_pages_is_empty_whatever_its_last_page_length(device):
    from gqa_decode_fuzz.kernel import for_definition

    args = _paged_call(device)
    valid = for_definition(PAGED)(*args)
    args[5] = torch.tensor([3, 64, 1], dtype=torch.int32, device=device)  # sequence 1 has no pages
    for ours, theirs in zip(for_definition(PAGED)(*args), valid):
        assert torch.equal(ours, theirs)
