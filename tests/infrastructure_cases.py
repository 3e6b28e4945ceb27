"""Properties whose case the machine cannot hold (tests/test_crash_containment.py runs them): the inputs, and the
oracle's float64 work (a GPU shared by many workers runs out there first)."""

from unittest import mock

import torch
from hypothesis import given
from hypothesis import strategies as st

from gqa_decode_fuzz.generation import oracles
from gqa_decode_fuzz.generation.cases import DecodeCase, build
from gqa_decode_fuzz.properties.checks import run_and_check


@given(case=st.just(DecodeCase(lengths=(1,), spare_pages=2**46)))  # a pool of 2**46 pages: 64 PB of K and V
def test_a_case_too_large_for_the_machine(impl, device, case):
    impl(*build(case, device))


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (a stand-in)")


@given(case=st.just(DecodeCase(lengths=(3, 5))))
def test_an_oracle_the_machine_cannot_hold(impl, device, case):
    with mock.patch.object(oracles, "_attend", _out_of_memory):
        run_and_check(impl, build(case, device), f"case {case}")
