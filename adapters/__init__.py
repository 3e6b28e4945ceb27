"""Adapters that put third-party decode kernels (SGLang, FlashInfer) under this suite's contract.

Each module exposes a ``run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None)`` for
``--impl=adapters/<module>.py:run``; they are not imported by the suite itself.
"""
