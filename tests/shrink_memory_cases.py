"""Run by tests/test_shrink_memory.py in a pytest of its own (not collected here), with an implementation that
is wrong on every case, so that each test fails and Hypothesis shrinks it.

A build observer keeps a weak reference to every pool built; at each build it notes how many pools of earlier
examples are still alive and their bytes (on CUDA also ``torch.cuda.max_memory_allocated``), and the module
writes the peaks to ``$GQA_SHRINK_MEMORY_OUT`` at its end.
"""

import json
import os
import weakref
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gqa_decode_fuzz.generation import cases
from gqa_decode_fuzz.generation.cases import DecodeCase, SuiteOutOfMemory, build
from gqa_decode_fuzz.properties.checks import run_and_check

POOLS: list[weakref.ref] = []
PEAK = {"builds": 0, "earlier_pools_alive": 0, "earlier_pool_bytes": 0, "pool_bytes": 0}


def _observe(case: DecodeCase, inputs: cases.DecodeInputs) -> None:
    alive = [pool for pool in (ref() for ref in POOLS) if pool is not None]
    PEAK["builds"] += 1
    PEAK["earlier_pools_alive"] = max(PEAK["earlier_pools_alive"], len(alive))
    PEAK["earlier_pool_bytes"] = max(PEAK["earlier_pool_bytes"], sum(p.nbytes for p in alive))
    PEAK["pool_bytes"] = max(PEAK["pool_bytes"], inputs.k_cache.nbytes)
    POOLS.append(weakref.ref(inputs.k_cache))
    if inputs.k_cache.is_cuda:
        PEAK["cuda_max_allocated"] = torch.cuda.max_memory_allocated()


cases.add_build_observer(_observe)


def teardown_module() -> None:
    Path(os.environ["GQA_SHRINK_MEMORY_OUT"]).write_text(json.dumps(PEAK))


@settings(max_examples=20, database=None, derandomize=True)
@given(spare_pages=st.integers(4_000, 8_000), length=st.integers(1, 40))
def test_a_failing_large_pool_shrinks(impl, device, spare_pages, length):
    case = DecodeCase(lengths=(length,), spare_pages=spare_pages)
    inputs = build(case, device)
    run_and_check(impl, inputs, f"case {case}")


FAILURES_BEFORE_OUT_OF_MEMORY = 3
_failures = []


@settings(max_examples=20, database=None, derandomize=True)
@given(length=st.integers(1, 40))
def test_out_of_memory_while_shrinking(impl, device, length):
    if len(_failures) >= FAILURES_BEFORE_OUT_OF_MEMORY:  # the suite cannot allocate any more examples
        raise SuiteOutOfMemory(f"simulated: the suite could not allocate the inputs of lengths=({length},)")
    _failures.append(length)
    run_and_check(impl, build(DecodeCase(lengths=(length,)), device), f"length {length}")
