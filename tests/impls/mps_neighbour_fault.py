"""A kernel whose crashes look, on CPU, like those of processes sharing a GPU under MPS.

A batch of one sequence "faults" only inside a pytest test (``PYTEST_CURRENT_TEST``): like
another process's fault reaching this one through an MPS server, it does not happen when
the case is replayed alone (``python -m gqa_decode_fuzz.record.repro``). Any other call is
tests/impls/simulated_cuda_fault.py: a kernel fault that a replay repeats. Used by
tests/test_mps.py.
"""

import os

from tests.impls import simulated_cuda_fault as kernel


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    if len(kv_indptr) == 2 and os.environ.get("PYTEST_CURRENT_TEST"):
        raise RuntimeError(kernel.MESSAGE)  # a neighbour's fault: this call did nothing wrong
    return kernel.run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
