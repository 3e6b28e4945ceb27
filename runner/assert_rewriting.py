"""Hypothesis's modules left out of pytest's assert rewriting, which would otherwise redo it at every start.

pytest rewrites the asserts of every module of a distribution that provides a pytest plugin, Hypothesis's among
them, and caches the result beside the module only where bytecode is written. Where it is not
(``PYTHONDONTWRITEBYTECODE=1``, as on the GPU image), every process of every run parses, rewrites and compiles the
Hypothesis modules the suite imports, a cost paid by each xdist worker and by each ``-x`` run a generation loop
makes (measured in docs/performance.md). Rewriting only improves the messages of
Hypothesis's internal asserts, which the suite never shows; they still run.

Must run before Hypothesis is first imported (``runner/plugin.py`` calls it before its own import of Hypothesis;
Hypothesis's pytest plugin imports none of it). It reaches into pytest's import hook, a private interface: where
that has changed, nothing is done and pytest rewrites as before.
"""

from __future__ import annotations

import sys

__all__ = ["leave_unrewritten"]


def leave_unrewritten(package: str) -> bool:
    """Keep pytest's import hook from rewriting ``package`` and its submodules from now on; whether it could.
    Modules already imported are not touched."""
    hooks = [hook for hook in sys.meta_path if type(hook).__name__ == "AssertionRewritingHook"]
    marked = [getattr(hook, "_must_rewrite", None) for hook in hooks]
    decided = [getattr(hook, "_marked_for_rewrite_cache", None) for hook in hooks]
    if not hooks or not all(isinstance(names, set) for names in marked) \
            or not all(isinstance(cache, dict) for cache in decided):
        return False
    for names, cache in zip(marked, decided):
        names.discard(package)
        for name in [name for name in cache if name == package or name.startswith(package + ".")]:
            del cache[name]
    return True
