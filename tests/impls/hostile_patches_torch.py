"""Hostile: the wrong kernel, and at import it patches torch's comparisons: float64 differences are zero,
``allclose`` and ``equal`` always agree.

In-process (``--isolation=off``) the suite's float64 error is then 0 everywhere; isolated, torch is patched
only in the implementation's own process.
"""

import torch

from tests.impls.wrong_kv_head import run

_sub = torch.Tensor.__sub__


def _no_difference(self, other):
    result = _sub(self, other)
    return torch.zeros_like(result) if result.dtype == torch.float64 else result


torch.Tensor.__sub__ = _no_difference
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True

__all__ = ["run"]
