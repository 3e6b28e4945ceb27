"""An editable install run from elsewhere: the checkout's package names as aliases of the installed ones.

``pip install -e .`` maps ``gqa_decode_fuzz.properties`` (and ``.kernel``, ``.reference``) onto this
checkout's folders, and its ``pytest11`` entry point loads the plugin as
``gqa_decode_fuzz.properties._plugin.plugin``. ``pytest --pyargs gqa_decode_fuzz.properties`` run from another
folder then collects the checkout's files: pytest reads the checkout's ``conftest.py`` (which would load the
plugin a second time, under its checkout name: ``ValueError: option names {'--impl'} already added``) and
imports each test file under its checkout name, ``properties.test_decode``, whose imports would make second
copies of the suite's modules beside the installed ones (the plugin's run state lives in one of them).

``install`` makes every import of a checkout name (``properties``, ``kernel``, ``reference``, ``adapters`` and
what lies below them) return the installed module of the same file, so there is one copy of each module and
one plugin; conftest.py calls it instead of loading the plugin when the installed copy is already loaded.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["install"]

NAMES = ("properties", "kernel", "reference", "adapters")


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``NAME.x`` (NAME one of ``names``) as the module ``namespace.NAME.x``, the same object."""

    def __init__(self, namespace: str, names: tuple[str, ...]) -> None:
        self.namespace, self.names = namespace, names

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        installed = f"{self.namespace}.{fullname}"
        if importlib.util.find_spec(installed) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(f"{self.namespace}.{spec.name}")  # the installed module itself

    def exec_module(self, module) -> None:
        """Nothing: ``create_module`` returned the installed module, already executed."""


def install(namespace: str = "gqa_decode_fuzz") -> None:
    """Alias the checkout's top-level names to ``namespace``'s modules (once per process)."""
    if not any(isinstance(finder, _Aliases) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Aliases(namespace, NAMES))
