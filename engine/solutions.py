"""FlashInfer-Bench Solution files as ``--impl=path/to/solution.json``.

A Solution is a JSON object: ``name``, ``definition`` (the Definition it implements), ``author``,
``description``, ``sources`` (``[{"path", "content"}]``) and ``spec`` (``language``: python | triton | cuda |
cpp; ``entry_point``: ``"file::function"``; ``target_hardware``; ``dependencies``;
``destination_passing_style``; ``binding`` for C++/CUDA). ``read_solution`` checks all of it without running
anything; ``load_solution`` writes the sources into a private temporary folder (a source path that is absolute
or climbs out with ``..`` is refused) and imports the entry point:

- ``python`` and ``triton``: the entry file is imported as a module of a package private to this solution, as
  the benchmark does (a source called ``kernel.py`` shadows no other module; sources import each other
  relatively, ``from . import helper``);
- ``cuda`` and ``cpp`` with the ``torch`` binding: every C/C++/CUDA source is built into one torch extension
  (``torch.utils.cpp_extension.load``, the common ``main.cpp`` binding + ``kernel.cu`` layout), and the entry
  symbol is read from it. A solution that names no binding is taken as ``torch`` when a source holds a
  ``PYBIND11_MODULE`` or ``TORCH_LIBRARY`` block; any other binding (``tvm-ffi``, the schema's default for
  C++/CUDA) is refused as not supported yet.

The calling convention: ``spec.destination_passing_style`` when the file states it. The schema's default is
true, but older files (the AccelOpt samples among them) omit it and return their results: for a file that does
not state it, a Python entry point whose signature takes exactly the definition's arguments is called in return
style, and one that takes two more (``output, lse``) in destination-passing style; the header says which.

FlashInfer's definitions take ``sm_scale`` as a required float: where the suite's own cases mean the default
(``sm_scale=None``), a solution is passed the definition's ``1/sqrt(head_dim)``.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib
import inspect
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .errors import ImplSpecError

if TYPE_CHECKING:
    from gqa_decode_fuzz.reference.definitions import Definition

__all__ = ["LANGUAGES", "Solution", "SolutionError", "load_solution", "read_solution"]

LANGUAGES = ("python", "triton", "cuda", "cpp")
_NATIVE = (".cu", ".cpp", ".cc", ".cxx", ".c")
_TORCH_BINDING_MARKS = ("PYBIND11_MODULE", "TORCH_LIBRARY")


class SolutionError(ImplSpecError):
    """A Solution file the suite cannot run: malformed, or a form not supported; the message names the field."""


@dataclass(frozen=True)
class Solution:
    """A Solution file, read and checked (nothing imported or built)."""

    path: Path
    sha256: str  # of the file's bytes: what a case file records
    name: str
    definition: str
    author: str
    description: str
    language: str
    entry_file: str
    entry_symbol: str
    target_hardware: tuple[str, ...]
    dependencies: tuple[str, ...]
    destination_passing_style: bool | None  # None: the file does not say
    binding: str | None
    sources: tuple[tuple[str, str], ...]  # (relative path, content)

    def summary(self) -> str:
        """One line for headers and reports."""
        return (f"solution {self.name!r} by {self.author} ({self.language}, entry {self.entry_file}::"
                f"{self.entry_symbol}, for {self.definition}; sha256 {self.sha256[:12]})")


def _fail(path: Path, what: str) -> SolutionError:
    return SolutionError(f"--impl={str(path)!r}: {what}")


def _text(data: dict, key: str, path: Path, *, required: bool = True) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise _fail(path, f"'{key}' must be a non-empty string, got {value!r}")
    return value


def _strings(spec: dict, key: str, path: Path) -> tuple[str, ...]:
    value = spec.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, f"spec.{key} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _safe_source_path(text: Any, path: Path) -> str:
    if not isinstance(text, str) or not text.strip():
        raise _fail(path, f"a source's 'path' must be a non-empty string, got {text!r}")
    parts = PurePosixPath(text.replace("\\", "/"))
    if parts.is_absolute() or Path(text).is_absolute() or (text[1:2] == ":"):
        raise _fail(path, f"source path {text!r} is absolute; sources are laid out in a folder of their own")
    if ".." in parts.parts:
        raise _fail(path, f"source path {text!r} climbs out of the solution's folder ('..')")
    return str(parts)


def _sources(data: dict, path: Path) -> tuple[tuple[str, str], ...]:
    sources = data.get("sources")
    if not isinstance(sources, list) or not sources:
        raise _fail(path, "'sources' must be a non-empty list of {'path', 'content'}")
    seen: dict[str, str] = {}
    for source in sources:
        if not isinstance(source, dict):
            raise _fail(path, f"each source must be an object {{'path', 'content'}}, got {type(source).__name__}")
        relative = _safe_source_path(source.get("path"), path)
        content = source.get("content")
        if not isinstance(content, str):
            raise _fail(path, f"source {relative!r}: 'content' must be a string")
        if relative in seen:
            raise _fail(path, f"source path {relative!r} appears twice")
        seen[relative] = content
    return tuple(seen.items())


def _entry(spec: dict, sources: tuple[tuple[str, str], ...], path: Path) -> tuple[str, str]:
    entry = spec.get("entry_point")
    if not isinstance(entry, str) or entry.count("::") != 1 or not all(entry.split("::")):
        raise _fail(path, f"spec.entry_point must be 'file::function' (e.g. 'main.py::run'), got {entry!r}")
    file, symbol = entry.split("::")
    file = _safe_source_path(file, path)
    if file not in dict(sources):
        raise _fail(path, f"spec.entry_point names {file!r}, which is not among the sources "
                          f"{[name for name, _ in sources]}")
    return file, symbol


def _binding(spec: dict, language: str, sources: tuple[tuple[str, str], ...], path: Path) -> str | None:
    binding = spec.get("binding")
    if language in ("python", "triton"):
        return None
    if binding is None and any(mark in content for name, content in sources if name.endswith(_NATIVE)
                               for mark in _TORCH_BINDING_MARKS):
        return "torch"
    if binding != "torch":
        shown = "none named (the schema's default, tvm-ffi)" if binding is None else repr(binding)
        raise _fail(path, f"spec.binding {shown} is not supported yet: the suite builds C++/CUDA solutions as a "
                          "torch extension (binding 'torch': a main.cpp with PYBIND11_MODULE beside kernel.cu)")
    return binding


def read_solution(path: Path | str) -> Solution:
    """The Solution the file holds, checked field by field; ``SolutionError`` naming the first problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except OSError as error:
        raise _fail(path, f"cannot read it ({error})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise _fail(path, f"not JSON ({error})") from None
    if not isinstance(data, dict):
        raise _fail(path, "a Solution file holds one JSON object")
    spec = data.get("spec")
    if not isinstance(spec, dict):
        raise _fail(path, "'spec' must be an object (language, entry_point, target_hardware, ...)")
    language = spec.get("language")
    if language not in LANGUAGES:
        raise _fail(path, f"spec.language {language!r} is not supported; expected one of {LANGUAGES}")
    dps = spec.get("destination_passing_style")
    if dps is not None and not isinstance(dps, bool):
        raise _fail(path, f"spec.destination_passing_style must be true or false, got {dps!r}")
    sources = _sources(data, path)
    entry_file, entry_symbol = _entry(spec, sources, path)
    if language in ("python", "triton") and not entry_file.endswith(".py"):
        raise _fail(path, f"a {language} solution's entry file must be a .py file, got {entry_file!r}")
    if language in ("cuda", "cpp") and not entry_file.endswith(_NATIVE):
        raise _fail(path, f"a {language} solution's entry file must be one of {_NATIVE}, got {entry_file!r}")
    return Solution(
        path=path.resolve(), sha256=hashlib.sha256(raw).hexdigest(), name=_text(data, "name", path),
        definition=_text(data, "definition", path), author=_text(data, "author", path),
        description=_text(data, "description", path, required=False), language=language, entry_file=entry_file,
        entry_symbol=entry_symbol, target_hardware=_strings(spec, "target_hardware", path),
        dependencies=_strings(spec, "dependencies", path), destination_passing_style=dps,
        binding=_binding(spec, language, sources, path), sources=sources,
    )


# ---- laying out, importing, building --------------------------------------------------------


def _package(solution: Solution) -> str:
    return f"_gqa_solution_{solution.sha256[:16]}"


@functools.cache  # one folder per solution file content and process
def lay_out(solution: Solution) -> Path:
    """The sources written under a private temporary folder (removed when the process ends): the folder that
    holds the solution's package, ``<folder>/<package>/<source paths>``."""
    folder = Path(tempfile.mkdtemp(prefix="gqa-decode-solution-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    package = folder / _package(solution)
    for relative, content in solution.sources:
        target = (package / relative).resolve()
        if package.resolve() not in target.parents:  # read_solution refused these already; a second line
            raise _fail(solution.path, f"source path {relative!r} leaves the solution's folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    return folder


def _import_python(solution: Solution, folder: Path) -> Any:
    # As the benchmark does: the folder on sys.path, the entry a module of the solution's own package (so its
    # sources import each other relatively, and a source called kernel.py shadows no other module).
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module = ".".join([_package(solution), *PurePosixPath(solution.entry_file).with_suffix("").parts])
    try:
        return importlib.import_module(module)
    except Exception as error:
        raise _fail(solution.path, f"importing {solution.entry_file} failed: {type(error).__name__}: {error}") \
            from error


def _build_extension(solution: Solution, folder: Path) -> Any:
    from torch.utils.cpp_extension import load

    package = folder / _package(solution)
    native = [str(package / name) for name, _ in solution.sources if name.endswith(_NATIVE)]
    try:
        return load(name=_package(solution), sources=native, extra_include_paths=[str(package)],
                    with_cuda=solution.language == "cuda", build_directory=str(package), verbose=False)
    except Exception as error:
        raise _fail(solution.path, f"building the torch extension from {[Path(s).name for s in native]} failed: "
                                   f"{type(error).__name__}: {str(error).strip()[-2000:]}") from error


def _positional_count(function: Callable) -> int | None:
    """How many positional parameters ``function`` takes; None when it takes any number or does not say."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
               for p in parameters)


def calling_convention(solution: Solution, function: Callable, arguments: int) -> tuple[bool, str]:
    """Whether to call ``function`` in destination-passing style, and why, in words."""
    if solution.destination_passing_style is not None:
        said = "destination-passing" if solution.destination_passing_style else "return"
        return solution.destination_passing_style, f"{said} style (spec.destination_passing_style)"
    count = _positional_count(function)
    if count == arguments:
        return False, (f"return style: the spec does not say, and {solution.entry_symbol} takes the definition's "
                       f"{arguments} arguments (the schema's default, destination-passing, would pass "
                       f"{arguments + 2})")
    return True, ("destination-passing style (the schema's default; the spec does not say"
                  + (f", and {solution.entry_symbol} takes {count} arguments)" if count is not None else ")"))


def _with_default_scale(function: Callable, definition: Definition) -> Callable:
    """``function`` passed the definition's default sm_scale where the suite's case says None."""
    where = list(definition.arguments).index("sm_scale")

    @functools.wraps(function)
    def call(*args, **kwargs):
        if len(args) > where and args[where] is None:
            args = (*args[:where], definition.default_sm_scale, *args[where + 1:])
        return function(*args, **kwargs)

    return call


def load_solution(solution: Solution, definition: Definition) -> tuple[Callable, bool, str]:
    """The solution's entry point, imported or built, taking the definition's arguments (None for sm_scale
    replaced by the default); whether it is destination-passing, and why, in words."""
    folder = lay_out(solution)
    if solution.language in ("python", "triton"):
        module = _import_python(solution, folder)
    else:
        module = _build_extension(solution, folder)
    function = getattr(module, solution.entry_symbol, None)
    if not callable(function):
        raise _fail(solution.path, f"{solution.entry_file} has no callable {solution.entry_symbol!r}")
    dps, why = calling_convention(solution, function, len(definition.arguments))
    return _with_default_scale(function, definition), dps, why
