"""A kernel that "faults" like an out-of-bounds access on a GPU, simulated on any device.

It raises CUDA's own message for an illegal address when every sequence of a batch
of two or more has at least 3 tokens, and then, like a poisoned CUDA context, on
every later call in the process. Correct (plain torch) otherwise. Used by
tests/test_crash_containment.py to exercise the containment path without a GPU.
"""

from tests.impls.torch_float32 import run as correct

MESSAGE = "CUDA error: an illegal memory access was encountered"
_poisoned = False


def faults_on(kv_indptr) -> bool:
    """The simulated fault's trigger: a batch of two or more sequences, each of 3 tokens or more."""
    bounds = kv_indptr.tolist()
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    return len(lengths) >= 2 and min(lengths) >= 3


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    global _poisoned
    if _poisoned or faults_on(kv_indptr):
        _poisoned = True
        raise RuntimeError(MESSAGE)
    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
