"""What is under test, and where: the ``--impl`` target, its declarations, and the device.

A target is ``package.module:function``, ``path/to/file.py:function`` or a FlashInfer-Bench Solution file
``path/to/solution.json`` (``solutions``: its sources laid out, imported or built; its definition and calling
convention read from it). The function takes the arguments of the run's definition, in its order
(``Definition.arguments``); it may declare, as attributes:

- ``for_definition(definition) -> callable``: it serves several definitions (other head
  counts, page sizes); the suite calls it once per definition it runs and tests what it
  returns. A target without it serves the one definition ``--definition`` names.
- ``returns_lse = False``: it computes no final LSE and returns ``(output, None)``; the
  suite then checks the output alone and says so in the report.
- ``knobs = {"name": (default, other, ...)}``: keyword arguments that change how it
  computes (split counts, block sizes); every property draws one value of each per
  example, shrinking toward the first.
- ``waives = ("empty_sequences", "input_validation")``: parts of the contract it does not
  meet by design (a serving kernel whose engine never sends an empty sequence or a bad
  page id). The suite then leaves empty sequences' rows unchecked, or skips the
  bad-input claims, and the report says so: a declared difference, not a pass.
- ``destination_passing_style = True``: it takes ``output`` and ``lse`` as its last arguments and writes
  them (FlashInfer-Bench's convention); the suite calls it through ``destinations.returning``, which allocates
  guarded, poisoned destinations and checks that it wrote all of them and nothing beside them.

The device is resolved once, here: on the CPU the kernel runs in Triton's interpreter,
which must be switched on, with the bf16 compatibility layer, before any Triton kernel
(ours or the target's) is imported. An xdist controller chooses its workers' device before
it imports torch (``device_type``) and has torch confirm the choice afterwards
(``confirm_device``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gqa_decode_fuzz.reference import definitions

from . import devices, solutions
from .errors import DeviceError, ImplSpecError

if TYPE_CHECKING:
    from gqa_decode_fuzz.reference.definitions import Definition

DEFAULT_IMPL = "gqa_decode_fuzz.kernel:run"

__all__ = ["DEFAULT_IMPL", "DeviceError", "ImplSpecError", "Target", "check_spec", "confirm_device", "device_type",
           "declared_by", "in_definition_order", "load_callable", "load_impl", "load_target", "make_target",
           "resolve_device"]


def resolve_device(choice: str):
    """``auto`` (cuda when available), ``cuda`` or ``cpu`` as a torch.device; on cpu, switch the
    interpreter on and install its bf16 compatibility layer (before any Triton kernel is imported)."""
    import torch

    _check_choice(choice)
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device=cuda but torch sees no CUDA device; try --device=cpu")
    if choice == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        from gqa_decode_fuzz.kernel import interpreter_compat  # numpy and Triton: not in an xdist controller

        interpreter_compat.install()
    return torch.device(choice)


def _check_choice(choice: str) -> None:
    if choice not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"--device={choice!r}: expected auto, cpu or cuda")


def device_type(choice: str) -> str:
    """The device type (``"cuda"`` or ``"cpu"``) that ``resolve_device(choice)`` gives, told without importing torch
    where CUDA's driver can answer (``devices.cuda_device_count``): what an xdist controller tells its workers before it
    imports torch. ``--device=cuda`` with no device raises ``resolve_device``'s error (asking torch first)."""
    _check_choice(choice)
    if choice == "cpu":
        return "cpu"
    if devices.cuda_device_count() > 0:
        return "cuda"
    return resolve_device("cuda").type if choice == "cuda" else "cpu"


def confirm_device(choice: str, chosen: str):
    """``resolve_device(chosen)`` for an xdist controller that chose ``chosen`` from ``choice`` with ``device_type``
    and told its workers so: where torch disagrees (``auto`` found the driver's GPUs but torch cannot use them, or
    the other way round), the run stops with a usage error rather than run on a device nobody meant."""
    import torch

    if choice == "auto" and torch.cuda.is_available() != (chosen == "cuda"):
        driver, torch_sees = ("reports a GPU", "none") if chosen == "cuda" else ("reports none", "a CUDA device")
        raise DeviceError(f"--device=auto: the CUDA driver {driver} but torch sees {torch_sees}; "
                          "choose one with --device=cuda or --device=cpu")
    return resolve_device(chosen)


WAIVERS = {
    "empty_sequences": "results of rows that see no key (empty decode sequences, prefill rows whose causal window "
                       "is empty) are not checked",
    "input_validation": "calls the contract forbids are not made (bad-input claims skipped)",
}


def in_definition_order(function: Callable, definition: Definition) -> Callable:
    """``function`` (which takes ``definition``'s arguments in its order) called with the suite's order, in which
    ``kv_last_page_len`` comes last (``cases.DecodeInputs``, ``prefill_cases.PrefillInputs``); keyword arguments
    (knobs) pass through."""
    if getattr(definition, "prefill", False):
        return _prefill_in_definition_order(function, definition)

    @functools.wraps(function)
    def call(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None, kv_last_page_len=None, **kwargs):
        if definition.paged:
            return function(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale, **kwargs)
        return function(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, **kwargs)

    return call


def _prefill_in_definition_order(function: Callable, definition: Definition) -> Callable:
    """``in_definition_order`` for causal prefill: the suite passes ``kv_indices`` None for ragged K and V."""
    ragged = not definition.page_size

    @functools.wraps(function)
    def call(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices=None, sm_scale=None, kv_last_page_len=None,
             **kwargs):
        if ragged:
            return function(q, k_cache, v_cache, qo_indptr, kv_indptr, sm_scale, **kwargs)
        if definition.paged:
            return function(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale,
                            **kwargs)
        return function(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, **kwargs)

    return call


@dataclass(frozen=True)
class Target:
    """The implementation under test and what it declares about itself."""

    spec: str
    function: Callable
    returns_lse: bool = True
    knobs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    waives: frozenset[str] = frozenset()
    _bound: dict[str, Callable] = field(default_factory=dict, compare=False, repr=False)
    destination_passing_style: bool = False  # ``serving`` adapts it (destinations.py)
    convention: str = ""  # how the calling convention was decided, in words (Solution files)
    solution: Any = None  # the ``solutions.Solution`` behind it, if any
    definition: Definition | None = None  # the ``Definition`` it implements, where it says (Solution files)

    @property
    def serves_several(self) -> bool:
        """Whether it declares ``for_definition`` (and so can run under every definition it accepts)."""
        return callable(getattr(self.function, "for_definition", None))

    def serving(self, definition: Definition) -> Callable:
        """The callable that serves ``definition``, taking the suite's argument order (bound once per definition);
        ``ImplSpecError`` when its ``for_definition`` refuses the definition or returns no callable."""
        if definition.name not in self._bound:
            function = self.function
            if self.serves_several:
                try:
                    function = self.function.for_definition(definition)
                except (ValueError, TypeError, NotImplementedError) as error:
                    raise ImplSpecError(f"--impl={self.spec!r} does not serve {definition.name}: {error}") from None
                if not callable(function):
                    raise ImplSpecError(f"--impl={self.spec!r}: for_definition({definition.name}) returned "
                                        f"{type(function).__name__}, not a callable")
            if self.destination_passing_style:  # the outputs as its last arguments, in the definition's order
                from . import destinations  # imports torch: not before an xdist controller starts its workers

                function = destinations.returning(function, definition)
            self._bound[definition.name] = in_definition_order(function, definition)
        return self._bound[definition.name]

    def declarations(self) -> list[str]:
        """What the target declares, in words, for report headers."""
        said = [self.solution.summary()] if self.solution is not None else []
        said += [self.convention or "destination-passing style"] if self.destination_passing_style or \
            self.convention else []
        said += [] if self.returns_lse else ["no LSE: output checked alone"]
        said += [f"knobs {', '.join(self.knobs)}"] if self.knobs else []
        return said + [f"waives {name}: {WAIVERS[name]}" for name in sorted(self.waives)]


def _declared_knobs(spec: str, knobs: Any) -> dict[str, tuple[Any, ...]]:
    knobs = knobs or {}
    if not isinstance(knobs, dict) or not all(
        isinstance(name, str) and isinstance(values, (tuple, list)) and values for name, values in knobs.items()
    ):
        raise ImplSpecError(f"--impl={spec!r}: knobs must map keyword names to non-empty tuples of values")
    return {name: tuple(values) for name, values in knobs.items()}


def declared_by(function: Callable) -> dict[str, Any]:
    """The declarations ``function`` carries as attributes, unchecked: what an isolated child reports."""
    return {"returns_lse": getattr(function, "returns_lse", True), "knobs": getattr(function, "knobs", None),
            "waives": getattr(function, "waives", ()),
            "destination_passing_style": getattr(function, "destination_passing_style", False),
            "serves_several": callable(getattr(function, "for_definition", None))}


def make_target(spec: str, function: Callable, declared: dict[str, Any], *, solution: Any = None,
                definition: Definition | None = None) -> Target:
    """The ``Target`` of ``function`` with its declarations (``declared_by``'s form, plus a Solution's
    ``convention``) checked; ``solution`` and ``definition`` where a Solution file says them."""
    dps = declared.get("destination_passing_style", False)
    if not isinstance(dps, bool):
        raise ImplSpecError(f"--impl={spec!r}: destination_passing_style must be True or False, got {dps!r}")
    returns_lse = declared.get("returns_lse", True)
    if not isinstance(returns_lse, bool):
        raise ImplSpecError(f"--impl={spec!r}: returns_lse must be True or False, got {returns_lse!r}")
    waives = declared.get("waives", ())
    if isinstance(waives, str) or not isinstance(waives, (tuple, list, set, frozenset)) \
            or not set(waives) <= set(WAIVERS):
        raise ImplSpecError(f"--impl={spec!r}: waives must be a tuple drawn from {tuple(WAIVERS)}, got {waives!r}")
    return Target(spec, function, returns_lse, _declared_knobs(spec, declared.get("knobs")), frozenset(waives),
                  destination_passing_style=dps, convention=declared.get("convention", ""), solution=solution,
                  definition=definition)


def load_target(spec: str, root: Path | None = None, definition: Definition | None = None) -> Target:
    """The ``Target`` that ``spec`` names, imported into this process, with its declarations checked (a
    destination-passing function is adapted per definition, by ``serving``). ``definition``: the one
    ``--definition`` names, if any; a Solution file for another one is refused (without it, a Solution's
    ``Target.definition`` is its own)."""
    solution = None
    if _is_solution(spec):
        solution, definition = solution_and_definition(spec, root, definition)
    function, declared = load_callable(spec, root)
    return make_target(spec, function, declared, solution=solution, definition=definition)


def load_callable(spec: str, root: Path | None = None) -> tuple[Callable, dict[str, Any]]:
    """What the process that runs the implementation loads (this one, or an isolated child): the callable and its
    declarations (``declared_by``'s form; a Solution's calling convention from its spec or its signature). A
    destination-passing one still takes ``output, lse``: the checker's process adapts it (``Target.serving``:
    ``destinations.returning`` around whatever forwards the call), so the guard bands are checked where the
    implementation cannot reach them."""
    if not _is_solution(spec):
        function = load_impl(spec, root)
        return function, declared_by(function)
    solution, own = solution_and_definition(spec, root, None)
    function, dps, convention = solutions.load_solution(solution, own)
    return function, {**declared_by(function), "destination_passing_style": dps, "convention": convention}


def _is_solution(spec: str) -> bool:
    return spec.endswith(".json") and ":" not in Path(spec).name


def _solution_path(spec: str, root: Path | None) -> Path:
    path = Path(spec)
    if not path.is_absolute():
        path = (root or Path.cwd()) / path
    if not path.is_file():
        raise ImplSpecError(f"--impl={spec!r}: no such file {path}")
    return path


def solution_and_definition(spec: str, root: Path | None, definition: Definition | None) -> tuple:
    """A Solution file's ``solutions.Solution`` and its definition, read and checked without importing its code;
    ``ImplSpecError`` where ``definition`` (``--definition``'s) is another one."""
    solution = solutions.read_solution(_solution_path(spec, root))
    if definition is not None and definition.name != solution.definition:
        raise ImplSpecError(f"--impl={spec!r} implements {solution.definition!r} but --definition={definition.name!r}"
                            "; leave --definition out (a Solution file names its own) or make them agree")
    try:
        own = definitions.by_name(solution.definition)
    except definitions.DefinitionError as error:
        raise ImplSpecError(f"--impl={spec!r}: its definition: {error}") from None
    return solution, own


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


def _parse_spec(spec: str, root: Path | None) -> tuple[Path | str, str]:
    """``spec``'s file (resolved against ``root``, default: cwd) or module name, and its attribute."""
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target or not attribute:
        raise ImplSpecError(f"--impl={spec!r}: expected 'package.module:function', 'path/to/file.py:function' "
                            "or 'path/to/solution.json'")
    if not target.endswith(".py"):
        return target, attribute
    path = Path(target)
    if not path.is_absolute():
        path = (root or Path.cwd()) / path
    if not path.is_file():
        raise ImplSpecError(f"--impl={spec!r}: no such file {path}")
    return path.resolve(), attribute


def check_spec(spec: str, root: Path | None = None, *, find: bool = True) -> None:
    """What ``load_impl`` checks without importing the target: the form, the file, the module being found (its
    parent packages are imported to find it; not with ``find=False``, for a target that runs in a process of its
    own). An xdist controller checks this much before starting its workers, the rest once they are starting."""
    if _is_solution(spec):  # read and checked in full: no torch, nothing imported
        solutions.read_solution(_solution_path(spec, root))
        return
    target, _ = _parse_spec(spec, root)
    if isinstance(target, Path):
        return
    try:  # a top-level name is found without running any of its code
        found = importlib.util.find_spec(target if find else target.partition(".")[0])
    except (ImportError, ValueError) as error:
        raise ImplSpecError(f"--impl={spec!r}: cannot import module {target!r} ({error})") from error
    if found is None:
        raise ImplSpecError(f"--impl={spec!r}: cannot import module {target!r} (no module named {target!r})")


def load_impl(spec: str, root: Path | None = None) -> Callable:
    """Return the callable ``spec`` names; relative file paths resolve against ``root`` (default: cwd)."""
    target, attribute = _parse_spec(spec, root)
    if isinstance(target, Path):
        module = _import_file(target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise ImplSpecError(f"--impl={spec!r}: cannot import module {target!r} ({error})") from error
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ImplSpecError(f"--impl={spec!r}: {spec.rpartition(':')[0]} has no callable {attribute!r}")
    return function
