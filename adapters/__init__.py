"""Adapters that put third-party attention kernels (SGLang, FlashInfer, PyTorch) under this suite's contract.

Decode modules expose entries taking ``(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None)``; the causal
prefill modules (``*_prefill``) a prefill definition's arguments, paged or ragged. Each is named by
``--impl=adapters/<module>.py:<entry>``; they are not imported by the suite itself.
"""
