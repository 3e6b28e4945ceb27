"""Right answers, and under tests/test_isolation.py's stand-in compute-sanitizer an out-of-bounds read logged for
each call whose batch ``faults_on``: what memcheck with ``--destroy-on-device-error kernel`` does to a planted
reader (the faulting kernel ends, the process lives on). The stand-in names its log in
``STAND_IN_SANITIZER_LOG``; without it (not sanitized) nothing is logged."""

import os

from tests.impls.simulated_cuda_fault import faults_on
from tests.impls.torch_float32 import run as correct


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    log = os.environ.get("STAND_IN_SANITIZER_LOG")
    if log and faults_on(kv_indptr):
        with open(log, "a", encoding="utf-8") as report:
            report.write("========= Invalid __global__ read of size 2 bytes (memcheck stand-in)\n"
                         "=========     at gqa_paged_decode_kernel+0x1d0\n")
    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
