"""A kernel whose fault surfaces after its call, as a GPU's does: at the next synchronisation.

The call returns, but reading its result raises CUDA's sticky error (on a GPU the oracle
or a read-back is where an asynchronous illegal address shows). Used by tests/test_repro.py:
the replay must count that as the case faulting again.
"""

from tests.impls.simulated_cuda_fault import MESSAGE


class _LostContext:
    """A result in a lost CUDA context: any use of it raises the sticky error."""

    def __getattr__(self, name: str):
        raise RuntimeError(MESSAGE)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    return _LostContext(), _LostContext()
