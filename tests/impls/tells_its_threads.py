"""Refuses every call, naming the CPU threads torch gives its process: how tests/test_isolation.py sees the pool of
an isolated child."""

import torch

__all__ = ["run"]


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    raise ValueError(f"threads={torch.get_num_threads()}")
