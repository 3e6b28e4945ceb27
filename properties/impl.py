"""Resolve ``--impl`` targets: ``package.module:function`` or ``path/to/file.py:function``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

DEFAULT_IMPL = "kernel:run"

__all__ = ["DEFAULT_IMPL", "ImplSpecError", "load_impl"]


class ImplSpecError(ValueError):
    """An ``--impl`` value that names no callable; the message says which part failed."""


def _import_file(path: Path):
    # A stable, unique module name per file lets Triton find the source and keeps two
    # files with the same stem apart.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"_impl_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImplSpecError(f"--impl: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_impl(spec: str, root: Path | None = None) -> Callable:
    """Return the callable ``spec`` names; relative file paths resolve against ``root`` (default: cwd)."""
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target or not attribute:
        raise ImplSpecError(f"--impl={spec!r}: expected 'package.module:function' or 'path/to/file.py:function'")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_absolute():
            path = (root or Path.cwd()) / path
        if not path.is_file():
            raise ImplSpecError(f"--impl={spec!r}: no such file {path}")
        module = _import_file(path.resolve())
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise ImplSpecError(f"--impl={spec!r}: cannot import module {target!r} ({error})") from error
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ImplSpecError(f"--impl={spec!r}: {target} has no callable {attribute!r}")
    return function
