"""Hostile: returns the right answer, then writes the wrong kernel's answer into it after returning: on a GPU
from a side stream that first sleeps, on the CPU from a thread that waits a few milliseconds.

In-process the check may read the right answer before the write lands; isolated, the child synchronises the
device before it answers (the side stream's write lands first, and the values are wrong), and the parent
compares the child's copy of each result with its own at the example's end and the next call (a thread's
late write fails as ``ResultChangedAfterReturn``).
"""

import threading
import time

import torch

from tests.impls.wrong_kv_head import correct
from tests.impls.wrong_kv_head import run as wrong

DELAY_S = 0.002


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    output, lse = correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    bad_output, bad_lse = wrong(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    if q.device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # ~25 ms of spinning before the writes
            output.copy_(bad_output)
            lse.copy_(bad_lse)
        return output, lse

    def overwrite():
        time.sleep(DELAY_S)
        output.copy_(bad_output)
        lse.copy_(bad_lse)

    threading.Thread(target=overwrite, daemon=True).start()
    return output, lse
