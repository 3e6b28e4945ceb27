"""The warm-up before a run's first example: its work runs on any device, its failures only warn, and it starts
only where tests run on CUDA (what it saves is measured on the GPU: docs/performance.md)."""

import types
import warnings

import pytest
import torch

from gqa_decode_fuzz.engine import isolation_child, triton_start
from gqa_decode_fuzz.generation import warm_up
from gqa_decode_fuzz.runner import plugin


def test_the_warm_up_case_builds_and_its_oracle_holds_its_own_rounding_on_the_cpu():
    warm_up.warm_up(torch.device("cpu"))  # on CUDA the same calls: a broken case or oracle API shows here


def test_a_failed_warm_up_warns_once_at_wait_and_does_not_raise(monkeypatch):
    def broken(device):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(warm_up, "warm_up", broken)
    warming = warm_up.Warming(torch.device("cpu"))
    with pytest.warns(RuntimeWarning, match="warm-up before the first example failed.*no such kernel"):
        warming.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warming.wait()  # told once


@pytest.mark.parametrize(("device", "controller", "starts"), [
    ("cpu", False, False), ("cuda", True, False), ("cuda", False, True)])
def test_the_warm_up_starts_only_in_a_process_that_runs_tests_on_cuda(monkeypatch, device, controller, starts):
    started = []
    monkeypatch.setattr(warm_up, "Warming", lambda device: started.append(device) or "warming")
    plan = types.SimpleNamespace(controller=controller)
    assert (plugin._warming(plan, torch.device(device)) is not None) is starts
    assert len(started) == starts
    monkeypatch.setenv(warm_up.ENABLED_ENV, "0")
    assert plugin._warming(plan, torch.device(device)) is None


def test_the_childs_triton_start_leaves_a_failure_to_the_first_call(monkeypatch):
    def broken(device):
        raise RuntimeError("triton cannot start")

    monkeypatch.setattr(triton_start, "start_triton", broken)
    isolation_child._warm_triton(torch.device("cuda"))  # no raise: the target's first call reports it
