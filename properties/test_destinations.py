"""Destination-passing style (DPS): a kernel that writes into ``output`` and ``lse`` passed to it writes every
element of both and nothing beside them, however the destinations sit in memory.

Every property already calls a DPS implementation through the suite's adapter
(``_plugin/destinations.py``): destinations poisoned with a NaN bit pattern no arithmetic produces, each with
a guard band of one batch row before and after, checked after every call. This file adds what only a DPS call
can get wrong: destinations that are slices of wider buffers (padded rows, every other element), batches with
empty sequences and batch 0. A destination layout a kernel cannot take may be refused (any exception under
``correct``; strict: ``TypeError``/``ValueError`` naming ``output`` or ``lse``), as with strided inputs; writing
outside a destination, or leaving part of one unwritten, is never a refusal. Skipped for an implementation
that returns its results.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gqa_decode_fuzz.engine.destinations import DESTINATION_LAYOUTS
from gqa_decode_fuzz.generation.cases import DecodeCase
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.checks import share_of_examples, short_cases
from gqa_decode_fuzz.properties.claims import property_claim

pytestmark = pytest.mark.destination_passing


@property_claim(claims.destinations_written)
@share_of_examples(0.5)
@given(case=short_cases(min_batch=0), layout=st.sampled_from(DESTINATION_LAYOUTS))
@example(case=DecodeCase(lengths=(2, 0, 3)), layout="contiguous")  # the last sequence's rows: the end of output
@example(case=DecodeCase(lengths=()), layout="contiguous")  # batch 0: nothing to write, nothing written
@example(case=DecodeCase(lengths=(2, 3)), layout="padded")
def test_destinations_are_written_whole_and_nothing_beside_them(impl, contract, device, case, layout):
    claims.destinations_written(impl, case, device, contract, layout=layout)
