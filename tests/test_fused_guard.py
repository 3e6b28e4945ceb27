"""The suite's own Triton kernels are checked against their torch paths before a process first uses them on a
device (reference/_fused_guard.py); one that disagrees or fails is not used there."""

import pytest
import torch

from gqa_decode_fuzz.reference import _fused_guard, bound, compare
from tests.fused_kernels import fused_device


@pytest.fixture(autouse=True)
def _fresh_verdicts(monkeypatch):
    """Verdicts of this test's own; the process's are back afterwards (a first use inside a graph capture, where a
    self-check cannot run, never happens: the first capture on a device follows an eager run)."""
    monkeypatch.setattr(_fused_guard, "_verdicts", {})


def test_a_kernel_that_agrees_is_trusted_and_asked_once():
    asked = []
    for _ in range(3):
        assert _fused_guard.trusted("a kernel", torch.device("cpu"), lambda device: asked.append(device) or True)
    assert asked == [torch.device("cpu")]


@pytest.mark.parametrize("agrees, why", [(lambda device: False, "answers differ"),
                                         (lambda device: 1 / 0, "ZeroDivisionError")])
def test_a_kernel_that_disagrees_or_fails_is_not_used_after_one_warning(agrees, why):
    device = torch.device("cpu")
    with pytest.warns(RuntimeWarning, match=f"a kernel: Triton's kernel is not used on cpu, .*{why}"):
        assert not _fused_guard.trusted("a kernel", device, agrees)
    assert not _fused_guard.trusted("a kernel", device, lambda device: True)  # the verdict stands for the process


@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")  # numpy's IEEE warnings (x / 0)
@pytest.mark.parametrize("agrees", [compare._verdict_agrees, bound._deviation_agrees],
                         ids=["comparison", "deviation term"])
def test_the_suites_kernels_pass_their_self_checks(agrees):
    assert agrees(torch.device(fused_device()))
