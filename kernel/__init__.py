"""The kernel under test: ``run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None)``, the seed
definition's, and ``for_definition(definition)``, the kernel of any definition of the GQA paged-decode
family (also ``run.for_definition``), and of any causal prefill definition, paged or ragged;
``for_prefill(num_qo_heads, num_kv_heads, head_dim, page_size, ragged)``, the prefill kernel of those
constants; ``validate``, ``run``'s input checks alone.

Runs on CUDA tensors natively, and on CPU tensors in Triton's interpreter when
``TRITON_INTERPRET=1`` is set before this package is imported.
"""

from .interpreter_compat import install as _install_interpreter_compat

_install_interpreter_compat()

from ._family import for_definition  # noqa: E402
from ._launch import (  # noqa: E402
    BLOCK_N,
    DEFAULT_SM_SCALE,
    HEAD_DIM,
    NUM_KV_HEADS,
    NUM_QO_HEADS,
    PAGE_SIZE,
    run,
    validate,
)
from ._prefill_launch import for_prefill  # noqa: E402

__all__ = ["BLOCK_N", "DEFAULT_SM_SCALE", "HEAD_DIM", "NUM_KV_HEADS", "NUM_QO_HEADS", "PAGE_SIZE", "for_definition",
           "for_prefill", "run", "validate"]
