"""The bad-input contract: a valid call with one thing broken is refused, and the next call works.

Every tier: a call the contract forbids (a page id outside the pool, a malformed
``kv_indptr``, a wrong shape, dtype or type) raises a Python exception, any
exception, before anything launches: an out-of-range page id read on a GPU
poisons the CUDA context, which the valid call made right after would reveal.
Calls the contract leaves to policy (tensors on another device, an odd
``sm_scale``) may be refused or computed; only the next call is checked.

``--contract=strict`` (this project's kernel): every corruption is refused with
``TypeError`` for a wrong type or dtype and ``ValueError`` for everything else, and
the message names the argument; CUDA tensors only.

Shapes are broken relative to the run's definition (``q_16_heads`` keeps half the query
heads, 16 of 32 in the seed's; ``k_cache_page_size_2`` doubles the page size). With pages
of several tokens ``kv_last_page_len`` is broken too: missing, of the wrong dtype or
length, or above the page size or negative (forbidden: a kernel would read outside the
page); 0 for a sequence that has pages is policy (the benchmark's reference then counts
only the full pages, FlashInfer's convention wants 1 .. page size): refused under strict.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption

from gqa_decode_fuzz.generation.cases import DecodeCase
from gqa_decode_fuzz.generation.strategies import decode_cases
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.claims import property_claim
from gqa_decode_fuzz.properties.corruptions import CORRUPTIONS, LIMITS, corruptions

pytestmark = pytest.mark.input_validation


@property_claim(claims.bad_input_handled)
@given(
    case=decode_cases(limits=LIMITS, min_batch=0),
    corruption=corruptions(),
    where=st.integers(0, 2**32 - 1),
)
# The seed validated no page id: on a GPU an out-of-range one is an illegal memory access.
@example(case=DecodeCase(lengths=(3,), spare_pages=2), corruption="page_id_equal_to_pool_size", where=0)
@example(case=DecodeCase(lengths=(3,)), corruption="page_id_negative", where=0)
# The seed checked neither dtypes nor kv_indptr's order.
@example(case=DecodeCase(lengths=(1,)), corruption="q_float16", where=0)
@example(case=DecodeCase(lengths=(2, 2, 2)), corruption="kv_indptr_not_monotonic", where=0)
@example(case=DecodeCase(lengths=(2,)), corruption="sm_scale_nan", where=0)
# This kernel's first wrapper: 1e39 passed as finite, then reached the kernel as float32 inf; and a
# call on a device other than cuda/cpu (meta) passed the device check in interpreter mode.
@example(case=DecodeCase(lengths=(2,)), corruption="sm_scale_beyond_float32", where=0)
@example(case=DecodeCase(lengths=(2,)), corruption="all_on_other_device", where=0)
def test_bad_input_is_refused_and_the_next_call_works(impl, contract, device, case, corruption, where):
    claims.bad_input_handled(impl, case, device, contract, corruption=corruption, where=where)


@property_claim(claims.bad_input_handled)
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_each_corruption_is_handled(impl, contract, device, corruption):
    """Every entry of the table, once (the property above samples them)."""
    case = DecodeCase(lengths=(2, 0, 3), spare_pages=1)
    try:
        claims.bad_input_handled(impl, case, device, contract, corruption=corruption, then_valid=False)
    except UnsatisfiedAssumption:
        pytest.skip(f"{corruption} does not apply to {case.shape.name}")
