"""Huge page pools (GPU only): page ids at and beyond 2**22 in a pool of 4.2M .. 8.4M pages (8.6 .. 17 GB of K+V).

``page_id * page_stride`` passes 2**31 at page 2**22 for the plain layout (stride
512), at 2**21 for a combined K/V buffer (stride 1024); head- and dim-major pools
overflow int32 in ``head * stride`` and ``dim * stride`` once they hold several
million pages. The builder fills the pool on the GPU and generates only the
referenced rows; the oracle gathers only those.

Cases are written in the seed definition's pages (512 elements each); under another
definition the pool holds as many elements, so page ids pass the same offsets: with
64-token pages of 4 KV heads (32,768 elements) ``page_id * page_stride`` passes 2**31
from page 2**16 on.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given

from gqa_decode_fuzz.generation.cases import DecodeCase, active_definition, definitions
from gqa_decode_fuzz.generation.strategies import SizeLimits, decode_cases
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.checks import share_of_examples
from gqa_decode_fuzz.properties.claims import property_claim

PAGE_ID_LIMIT = 2**22  # page ids from here on overflow an int32 page_id * 512
HUGE = SizeLimits(max_batch=4, max_len=1024, max_spare_pages=2**23)

pytestmark = pytest.mark.gpu


@property_claim(claims.within_bound)
@share_of_examples(0.1, at_least=5)
@given(case=decode_cases(
    limits=HUGE, min_spare_pages=PAGE_ID_LIMIT + 8192, page_layouts=("pool_end", "shuffled"), pool_fills=("nan", "inf"),
    kv_layouts=("separate", "combined", "heads_outer", "dim_outer", "padded_dim"),
))
# The seed computed page_id * stride in int32: page 2**22 is the first to wrap.
@example(case=DecodeCase(lengths=(1,), page_layout="pool_end", spare_pages=PAGE_ID_LIMIT))
# Head-major pool: head 3 sits 3 * P * 128 elements in, past 2**31 for P above ~5.6M pages.
@example(case=DecodeCase(lengths=(3, 1), page_layout="pool_end", spare_pages=6_000_000, kv_layout="heads_outer"))
# Dim-major pool: dim 127 sits 127 * P * 4 elements in, past 2**31 for P above ~4.23M pages.
@example(case=DecodeCase(lengths=(3,), page_layout="pool_end", spare_pages=4_300_000, kv_layout="dim_outer"))
def test_page_ids_beyond_2_to_the_22_give_the_right_answer(impl, device, contract, large_allocation, case):
    case = as_deep_in_the_active_definition(case)
    # Up to ~20 GB per example: one such example per GPU at a time. The claim builds and checks in frames of its
    # own, whose tensors go when it returns, or, when it fails, when ``large_allocation`` clears its traceback's
    # frames (before the next worker's turn, not after the shrink). Through the claim, as every property: a
    # strided layout the implementation refuses leaves the example undecided here too (``claims.Claim``).
    large_allocation(claims.within_bound, impl, case, device, contract)


def as_deep_in_the_active_definition(case: DecodeCase) -> DecodeCase:
    """``case`` (its pool counted in the seed's pages) for the active definition, its pool as many elements deep."""
    active, seed = active_definition(), definitions.SEED
    spare = -(-case.spare_pages * seed.page_elements // active.page_elements)
    return replace(case, spare_pages=spare, definition=active.name)
