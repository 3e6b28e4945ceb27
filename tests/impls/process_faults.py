"""Kernels whose fault takes their whole process down, or never returns: correct (plain torch) until a batch of
two or more sequences of 3 tokens or more (``simulated_cuda_fault.faults_on``), then

- ``segfault``: dereferences address 0 (SIGSEGV, as a kernel's host code might);
- ``exits``: ``os._exit(3)``, as a library that gives up might;
- ``hangs``: never returns.

In-process each would end (or stall) the pytest process; isolated, each fails its example with
``ImplementationCrashed`` or ``ImplementationHung`` and shrinks to ``lengths=(3, 3)`` (tests/test_isolation.py).
"""

import ctypes
import os
import time

from tests.impls.simulated_cuda_fault import faults_on
from tests.impls.torch_float32 import run as correct

__all__ = ["exits", "hangs", "segfault"]


def segfault(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    if faults_on(kv_indptr):
        ctypes.string_at(0)
    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)


def exits(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    if faults_on(kv_indptr):
        os._exit(3)
    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)


def hangs(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    while faults_on(kv_indptr):
        time.sleep(1.0)
    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
