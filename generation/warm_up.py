"""First calls made before a run's first example, so that it does not pay them.

A process's first example on a GPU pays one-off costs that have nothing to do with the case: Triton's start
(hashing its own sources for its cache key, loading its driver helpers), loading the fused hash kernels,
torch's first CUDA kernels, cuBLAS and a first graph capture (docs/performance.md). ``warm_up`` makes those
calls on a small plain case, in a thread the runner starts while the implementation loads (the isolated child
starts Triton on its own: ``engine/triton_start.py``). It costs only time that would be spent anyway, and it
does not call the implementation under test. ``GQA_DECODE_WARM_UP=0`` turns it off (for measuring).
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

from gqa_decode_fuzz import reference
from gqa_decode_fuzz.reference import definitions

from .cases import DecodeCase, build
from .oracles import oracle_of

__all__ = ["ENABLED_ENV", "Warming", "warm_up", "warm_up_enabled"]

ENABLED_ENV = "GQA_DECODE_WARM_UP"

_CASE = DecodeCase(lengths=(1, 17), definition=definitions.SEED.name)


def warm_up_enabled() -> bool:
    """Whether runs warm up before their first example: unless ``GQA_DECODE_WARM_UP=0``."""
    return os.environ.get(ENABLED_ENV, "1") != "0"


def warm_up(device: torch.device) -> None:
    """Build a small case on ``device``, compute its oracle and hold the oracle's own bf16 rounding to its bound
    (worth it on CUDA only, where the first calls cost; any device does the same work)."""
    inputs = build(_CASE, device, observe=False)
    expected = oracle_of(inputs)  # its stage clock times nothing: no example is being sampled yet
    reference.assert_within_bound(expected.output.to(torch.bfloat16), expected.lse.float(), expected)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Warming:
    """``warm_up(device)`` in a daemon thread from construction; ``wait()`` before the first example.

    A failure only warns: whatever broke the warm-up breaks the first example too, which reports it in full.
    """

    def __init__(self, device: torch.device) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(device,), name="gqa-decode-warm-up", daemon=True)
        self._thread.start()

    def _run(self, device: torch.device) -> None:
        try:
            warm_up(device)
        except Exception as error:  # noqa: BLE001 - reported by wait(), and by the first example in full
            self._error = error

    def wait(self) -> None:
        """Block until the warm-up ends (at once after the first call)."""
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            warnings.warn(f"gqa-decode: the warm-up before the first example failed: {error!r}", RuntimeWarning,
                          stacklevel=2)
