"""A correct kernel that is merely slow: each call sleeps 50 ms, then answers as the padded torch panel member
does. Isolated or not it must pass: a deadline measured in seconds is no verdict on a slow kernel."""

import time

from tests.impls.panel_torch_padded import run as correct

SLEEP_S = 0.05


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    time.sleep(SLEEP_S)
    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
