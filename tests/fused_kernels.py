"""Where the suite's own Triton kernels (the builder's fused draws, the bound's deviation term) can run in a test:
each is held to its torch path in Triton's interpreter on the CPU and on CUDA."""

import os

import pytest
import torch


def fused_device() -> str:
    """CUDA, else the interpreter on the CPU; skips the test where neither runs."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    pytest.skip("needs CUDA or Triton's interpreter (TRITON_INTERPRET=1)")
