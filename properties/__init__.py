"""The property suite: claims about any implementation of the decode contract, and their vocabulary.

``cases`` (descriptors and the builder), ``strategies``, ``checks`` and ``transforms``
are what the ``test_*.py`` claims are written in; ``_plugin`` is the pytest plugin that
runs them; ``repro`` replays a saved failure (``python -m properties.repro FILE``).
"""

import importlib
from types import ModuleType

# "" in a checkout, where kernel/ and reference/ are top-level packages; "gqa_decode_fuzz" when
# installed, where they live beside this package under one namespace (no clash with other projects).
NAMESPACE = __name__.rpartition(".")[0]


def sibling(name: str) -> ModuleType:
    """Import one of the suite's sibling packages (``reference``, ``kernel``) wherever it is installed."""
    return importlib.import_module(f"{NAMESPACE}.{name}" if NAMESPACE else name)
