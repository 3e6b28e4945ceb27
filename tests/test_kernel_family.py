"""The kernel serves every definition of the family, and checks the paged call as strictly as the seed's.

``for_definition(d)`` is compared with the float32 reference inside each built-in definition file (independent of
the suite's float64 oracle) on ragged batches with empty sequences, shuffled page ids, NaN junk in the pages no
sequence references, NaN and Inf in the unused slots of last pages, and strided q and K/V. The tolerance is derived
in ``_output_bound``, not tuned.
"""

from __future__ import annotations

import inspect
import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reference.compare import compare_all, raise_if_any
from reference.definitions import BUILT_IN, SEED, Definition, load

PAGED = BUILT_IN["gqa_paged_decode_h20_kv4_d128_ps64"]
# Beyond the built-in family: the suite's file definition (eight 16-token pages per block of 128 tokens), and pages
# longer than a block (a block boundary inside a page) with 8 query heads padded to 16, one per KV head, head dim 64.
# The paged reference reads its shapes from the tensors, so it serves these too.
FAMILY = [*BUILT_IN.values(), load("definitions/gqa_paged_decode_h16_kv2_d128_ps16.json", Path(__file__).parent),
          Definition("gqa_paged_decode_h8_kv8_d64_ps256", 8, 8, 64, 256, reference=PAGED.reference)]
# Per case: tokens per sequence, sm_scale, whether q, K and V are strided views (K and V differently). With
# 64-token pages the lengths put 3, 64 (a full page), 1 and 8 tokens in the last pages, over one to four pages;
# 200 tokens take two blocks of 128, and keys of spread 3 make a later block raise the running max.
CASES = [((3, 0, 64, 65), None, False), ((200, 0, 1), 0.07, True)]
# Both outputs are within 2**-8 of what they round; the float32 steps (128-term dots, sums of a few hundred
# weights) stay below 2**-14 of the same terms: a margin of 2**-6 on 2**-8.
MARGIN = 1 + 2.0**-6
# LSE, base 2: both in float32; the dots of unit normals at scale 1/sqrt(128) are off by about 1e-6 and a
# logsumexp of L terms by about L * 2**-24, far below 2**-12.
LSE_BOUND = 2.0**-12


def _for_definition():
    from kernel import for_definition  # imported after the device fixture has switched the interpreter on (CPU)

    return for_definition


def _reference(definition):
    namespace = {}
    exec(definition.reference, namespace)  # the definition file's own float32 run()
    return namespace["run"]


def _pool(definition, pages: int, layout: str, device) -> torch.Tensor:
    """A [pages, page_size, kv_heads, dim] pool of NaN: ``plain``; ``heads_major``, a view of a head-major buffer
    with padded rows (every stride differs from a plain pool's but dim's); ``dim_major``, a view of a dim-major
    buffer (dim's stride is the largest, the slots' is 1)."""
    size, heads, dim = definition.page_size, definition.num_kv_heads, definition.head_dim

    def junk(*shape):
        return torch.full(shape, math.nan, dtype=torch.bfloat16, device=device)

    if layout == "heads_major":
        return junk(pages, heads, size, dim + 8)[..., 4:-4].transpose(1, 2)
    if layout == "dim_major":
        return junk(dim, pages, heads, size).permute(1, 3, 2, 0)
    return junk(pages, size, heads, dim)


def _case(definition, lengths: tuple[int, ...], strided: bool, seed: int, device) -> list[torch.Tensor]:
    """The arguments before sm_scale for sequences of ``lengths`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    size, heads, dim = definition.page_size, definition.num_kv_heads, definition.head_dim
    counts = [math.ceil(n / size) for n in lengths]
    ids = torch.randperm(sum(counts) + 4, generator=gen) + 1  # page 0 and four others nobody references stay NaN
    k_cache, v_cache = (_pool(definition, len(ids) + 1, layout, device)
                        for layout in (("heads_major", "dim_major") if strided else ("plain", "plain")))
    for b, (n, count) in enumerate(zip(lengths, counts)):
        pages = ids[sum(counts[:b]):sum(counts[:b + 1])].to(device)
        for cache, spread in ((k_cache, 3.0), (v_cache, 1.0)):  # keys of spread 3: peaked softmax weights
            rows = torch.randn((count * size, heads, dim), generator=gen) * spread
            rows[n:] = torch.tensor([math.nan, math.inf]).repeat(count * size)[: count * size - n, None, None]
            cache[pages] = rows.view(count, size, heads, dim).to(device, torch.bfloat16)
    if strided:  # dim-major, and a slice of more heads: no stride of q is a plain one's
        q = torch.randn((len(lengths), dim, definition.num_qo_heads + 3), generator=gen).to(device, torch.bfloat16)
        q = q.transpose(1, 2)[:, 1:1 + definition.num_qo_heads]
    else:
        q = torch.randn((len(lengths), definition.num_qo_heads, dim), generator=gen).to(device, torch.bfloat16)
    kv_indptr = torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32, device=device)
    args = [q, k_cache, v_cache, kv_indptr, ids[:sum(counts)].to(device, torch.int32)]
    if definition.paged:
        last = [n - (count - 1) * size if count else 0 for n, count in zip(lengths, counts)]
        args.append(torch.tensor(last, dtype=torch.int32, device=device))
    return args


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
    for seed, (lengths, scale, strided) in enumerate(CASES):
        args = _case(definition, lengths, strided, seed, device)
        output, lse = kernel(*args, scale)
        scale = definition.default_sm_scale if scale is None else scale
        expected, expected_lse = reference(*args, scale)
        mismatches = compare_all([
            ("output", output, expected.double(), _output_bound(expected, args, reference, scale)),
            ("lse", lse, expected_lse.double(), torch.full_like(expected_lse, LSE_BOUND, dtype=torch.float64)),
        ])
        raise_if_any(mismatches, f"{definition.name}: lengths={lengths}, strided={strided}")
        empty = [b for b, n in enumerate(lengths) if n == 0]  # exactly 0 and -inf (the bound passes only -inf)
        assert not output[empty].float().abs().sum(), f"empty sequences' output is not 0: {output[empty]}"
        assert bool((lse[empty] == -math.inf).all()), f"empty sequences' lse is not -inf: {lse[empty]}"


def test_the_seed_definition_is_run_itself():
    import kernel

    assert kernel.run.for_definition is kernel.for_definition
    assert kernel.for_definition(SEED) is kernel.run
    assert kernel.for_definition(PAGED) is kernel.for_definition(PAGED)


@pytest.mark.parametrize("definition", [pytest.param(d, id=d.name) for d in BUILT_IN.values()])
def test_each_served_function_takes_its_definitions_arguments(definition):
    from kernel import for_definition

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
    from kernel import for_definition

    fields = {"name": "my_decode", "num_qo_heads": 32, "num_kv_heads": 4, "head_dim": 128, "page_size": 16, **change}
    with pytest.raises(ValueError, match=f"definition 'my_decode' is not supported by this kernel: {reason}"):
        for_definition(SimpleNamespace(**fields, paged=fields["page_size"] > 1))


def _paged_call(device):
    """A valid call of PAGED: sequences of 3, 0 and 65 tokens."""
    return _case(PAGED, (3, 0, 65), False, 0, device)


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
    from kernel import for_definition

    args = _paged_call(device)
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        value = value.to(device)
    args[argument] = value
    with pytest.raises(error, match=message):
        for_definition(PAGED)(*args)


def test_a_sequence_without_pages_is_empty_whatever_its_last_page_length(device):
    from kernel import for_definition

    args = _paged_call(device)
    valid = for_definition(PAGED)(*args)
    args[5] = torch.tensor([3, 64, 1], dtype=torch.int32, device=device)  # sequence 1 has no pages
    for ours, theirs in zip(for_definition(PAGED)(*args), valid):
        assert torch.equal(ours, theirs)
