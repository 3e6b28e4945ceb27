#!/usr/bin/env bash
# compute-sanitizer on one call, with no suite process around it (GPU only): the planted one-past reader with
# torch's caching allocator off and on, and this project's kernel (which must log no error). What each prints
# and its exit status; the isolated child (benchmarks/sanitizer_probe.py) should agree.
#   bash benchmarks/sanitizer_direct.sh
set -u
CALL='import torch
from properties.cases import DecodeCase, build
from importlib import import_module
module, name = "IMPL".split(":")
run = getattr(import_module(module), name)
inputs = build(DecodeCase(lengths=(3, 130)), "cuda", observe=False)
output, lse = run(*inputs.arguments())
torch.cuda.synchronize()
print("answered", tuple(output.shape), float(lse.float().sum()))'
for setting in "reads_one_past 1" "reads_one_past 0" "kernel 1"; do
  set -- $setting
  impl=$([ "$1" = kernel ] && echo "kernel:run" || echo "tests.impls.$1:run")
  echo "== $impl, PYTORCH_NO_CUDA_MEMORY_CACHING=$2"
  PYTORCH_NO_CUDA_MEMORY_CACHING=$2 timeout 60 compute-sanitizer --tool memcheck --print-limit 5 \
    python3 -c "${CALL/IMPL/$impl}" 2>&1 | grep -v "^=========     Host Frame\|^=========         " | head -n 40
  echo "exit ${PIPESTATUS[0]}"
done
