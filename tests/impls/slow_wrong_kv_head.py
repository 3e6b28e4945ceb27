"""``wrong_kv_head`` slowed to 0.2 s a call, so that shrinking its failure outlasts a one-second --shrink-limit
(tests/test_shrink_limit.py)."""

import time

from tests.impls.wrong_kv_head import run as wrong

SLEEP_S = 0.2


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    time.sleep(SLEEP_S)
    return wrong(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
