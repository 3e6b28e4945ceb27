"""The contract as data: a ``Definition`` of one GQA paged-decode kernel, read from a FlashInfer-Bench Definition file.

Every layer of the suite (builder, strategies, oracle, bound, checks, case files, replay,
report) reads the shape of the call from one ``Definition``; none keeps a constant of its
own. The family FlashInfer-Bench's ``flashinfer-trace`` data set defines is built in, as
Definition files in ``definitions/`` beside this module; any other file of the GQA paged
decode kind (other head counts, head dim or page size) is read the same way, and anything
else is refused with a message that names what is not supported.

This module imports neither torch nor Triton: an xdist controller resolves ``--definition``
before it starts its workers.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BUILT_IN", "Definition", "DefinitionError", "SEED", "SEED_NAME", "by_name", "from_json", "load", "register",
    "select",
]

SEED_NAME = "gqa_paged_decode_h32_kv4_d128_ps1"
_BUILT_IN_DIR = Path(__file__).resolve().parent / "definitions"
_NAME = re.compile(r"gqa_paged_decode_h(\d+)_kv(\d+)_d(\d+)_ps(\d+)")

# The call, in the order the implementation takes it; kv_last_page_len only where pages hold several tokens.
_CONSTANTS = ("num_qo_heads", "num_kv_heads", "head_dim", "page_size")
_VARIABLES = ("batch_size", "num_pages", "len_indptr", "num_kv_indices")
_INPUTS = {
    "q": (["batch_size", "num_qo_heads", "head_dim"], "bfloat16"),
    "k_cache": (["num_pages", "page_size", "num_kv_heads", "head_dim"], "bfloat16"),
    "v_cache": (["num_pages", "page_size", "num_kv_heads", "head_dim"], "bfloat16"),
    "kv_indptr": (["len_indptr"], "int32"),
    "kv_indices": (["num_kv_indices"], "int32"),
    "kv_last_page_len": (["batch_size"], "int32"),
    "sm_scale": (None, "float32"),
}
_OUTPUTS = {
    "output": (["batch_size", "num_qo_heads", "head_dim"], "bfloat16"),
    "lse": (["batch_size", "num_qo_heads"], "float32"),
}
# Constraints every such definition states, whitespace removed; the builder meets them by construction.
_KNOWN_CONSTRAINTS = {"len_indptr==batch_size+1", "num_kv_indices==kv_indptr[-1].item()"}


class DefinitionError(ValueError):
    """A definition the suite cannot test: not GQA paged decode, or malformed; the message names what."""


@dataclass(frozen=True)
class Definition:
    """One GQA paged-decode contract: its name, constants and argument list.

    ``reference`` is the Python source of the definition file's own float32 ``run`` (checked against
    the float64 oracle by the suite's tests); ``origin`` is ``built-in`` or the file it was read from.
    """

    name: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    description: str = ""
    reference: str = field(default="", repr=False, compare=False)
    origin: str = field(default="built-in", compare=False)

    @property
    def group(self) -> int:
        """Query heads per KV head: query head h reads KV head h // group."""
        return self.num_qo_heads // self.num_kv_heads

    @property
    def default_sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def paged(self) -> bool:
        """Pages of several tokens: the call takes ``kv_last_page_len``."""
        return self.page_size > 1

    @property
    def arguments(self) -> tuple[str, ...]:
        """The implementation's positional arguments, in order."""
        last = ("kv_last_page_len",) if self.paged else ()
        return ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", *last, "sm_scale")

    @property
    def page_elements(self) -> int:
        """Elements of one K (or V) page: the page stride of a plain pool."""
        return self.page_size * self.num_kv_heads * self.head_dim

    def signature(self) -> str:
        return f"run({', '.join(self.arguments)}) -> (output, lse)"

    def summary(self) -> str:
        """One line for headers and reports."""
        return (f"{self.name} ({self.num_qo_heads} query heads over {self.num_kv_heads} KV heads, head dim "
                f"{self.head_dim}, page size {self.page_size})")

    def to_json(self) -> dict[str, Any]:
        """The definition as a FlashInfer-Bench Definition object (what ``from_json`` reads back)."""
        values = dict(zip(_CONSTANTS, (self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)))
        axes = {name: {"type": "const", "value": values[name]} if name in values else {"type": "var"}
                for name in ("batch_size", "num_qo_heads", "num_kv_heads", "head_dim", "num_pages", "page_size",
                             "len_indptr", "num_kv_indices")}
        return {
            "name": self.name, "op_type": "gqa_paged", "description": self.description, "axes": axes,
            "inputs": {name: {"shape": _INPUTS[name][0], "dtype": _INPUTS[name][1]} for name in self.arguments},
            "outputs": {name: {"shape": shape, "dtype": dtype} for name, (shape, dtype) in _OUTPUTS.items()},
            "constraints": ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"],
            "reference": self.reference,
        }


def _refuse(where: str, what: str) -> DefinitionError:
    return DefinitionError(f"definition {where}: {what}")


def _constants(data: dict, where: str) -> dict[str, int]:
    axes = data.get("axes")
    if not isinstance(axes, dict):
        raise _refuse(where, "'axes' must be an object of axis name to {'type': 'const' | 'var', ...}")
    unknown = sorted(set(axes) - set(_CONSTANTS) - set(_VARIABLES))
    if unknown:
        raise _refuse(where, f"axes {unknown} are not those of GQA paged decode (not supported)")
    constants = {}
    for name in _CONSTANTS:
        axis = axes.get(name)
        if not isinstance(axis, dict) or axis.get("type") != "const":
            raise _refuse(where, f"axis {name!r} must be a const (a variable {name} is not supported)")
        value = axis.get("value")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _refuse(where, f"axis {name!r} must have a positive integer value, got {value!r}")
        constants[name] = value
    for name in _VARIABLES:
        if name in axes and axes[name].get("type") != "var":
            raise _refuse(where, f"axis {name!r} must be a var (a fixed {name} is not supported)")
    if constants["num_qo_heads"] % constants["num_kv_heads"]:
        raise _refuse(where, f"num_qo_heads={constants['num_qo_heads']} is not a multiple of "
                             f"num_kv_heads={constants['num_kv_heads']}")
    return constants


def _check_tensors(kind: str, given: Any, expected: dict[str, tuple], order: list[str], where: str) -> None:
    if not isinstance(given, dict):
        raise _refuse(where, f"'{kind}' must be an object of name to {{'shape', 'dtype'}}")
    if list(given) != order:
        raise _refuse(where, f"{kind} {list(given)} are not supported: GQA paged decode takes {order}, in that order")
    for name in order:
        shape, dtype = expected[name]
        spec = given[name] if isinstance(given[name], dict) else {}
        got_shape = spec.get("shape")
        if got_shape == []:  # a scalar written as an empty shape
            got_shape = None
        if got_shape != shape or spec.get("dtype") != dtype:
            raise _refuse(where, f"{kind[:-1]} {name!r} is shape {got_shape} {spec.get('dtype')}; only "
                                 f"{shape} {dtype} is supported")


def from_json(data: Any, origin: str = "built-in") -> Definition:
    """The ``Definition`` a FlashInfer-Bench Definition object describes; ``DefinitionError`` naming what is not
    supported for anything other than GQA paged decode with bf16 inputs."""
    where = repr(data.get("name")) if isinstance(data, dict) else origin
    if not isinstance(data, dict):
        raise _refuse(where, "expected a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _refuse(where, "'name' must be a non-empty string")
    if data.get("op_type") != "gqa_paged":
        raise _refuse(where, f"op_type {data.get('op_type')!r} is not supported (only 'gqa_paged' decode)")
    if "prefill" in name:
        raise _refuse(where, "prefill is not supported (only decode: one query token per sequence)")
    constants = _constants(data, where)
    arguments = ["q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale"]
    if constants["page_size"] > 1:
        arguments.insert(5, "kv_last_page_len")
    _check_tensors("inputs", data.get("inputs"), _INPUTS, arguments, where)
    _check_tensors("outputs", data.get("outputs"), _OUTPUTS, list(_OUTPUTS), where)
    constraints = data.get("constraints") or []
    unknown = [c for c in constraints if not isinstance(c, str) or c.replace(" ", "") not in _KNOWN_CONSTRAINTS]
    if unknown:
        raise _refuse(where, f"constraints {unknown} are not supported (known: {sorted(_KNOWN_CONSTRAINTS)})")
    named = _NAME.fullmatch(name)
    if named and tuple(map(int, named.groups())) != tuple(constants[c] for c in _CONSTANTS):
        raise _refuse(where, f"its name says h{named[1]} kv{named[2]} d{named[3]} ps{named[4]} but its axes say "
                             + " ".join(f"{c}={constants[c]}" for c in _CONSTANTS))
    reference = data.get("reference") or ""
    if not isinstance(reference, str):
        raise _refuse(where, "'reference' must be Python source text")
    return Definition(name=name, description=str(data.get("description") or ""), reference=reference,
                      origin=origin, **constants)


def _read(path: Path, origin: str) -> Definition:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise DefinitionError(f"definition {path}: cannot read it ({error})") from None
    except json.JSONDecodeError as error:
        raise DefinitionError(f"definition {path}: not JSON ({error})") from None
    return from_json(data, origin)


BUILT_IN: dict[str, Definition] = {
    definition.name: definition
    for definition in sorted((_read(path, "built-in") for path in _BUILT_IN_DIR.glob("*.json")),
                             key=lambda d: (d.page_size, d.num_qo_heads, d.num_kv_heads))
}
SEED = BUILT_IN[SEED_NAME]
_known: dict[str, Definition] = dict(BUILT_IN)


def register(definition: Definition) -> Definition:
    """Make ``definition`` known by name (``by_name``) in this process; a different one of the same name is refused."""
    known = _known.setdefault(definition.name, definition)
    if known != definition:
        raise DefinitionError(f"definition {definition.name!r} from {definition.origin} differs from the one "
                              f"already known ({known.origin}): {known.summary()}")
    return known


def by_name(name: str | None) -> Definition:
    """A built-in or registered definition; None means the seed's."""
    if name is None:
        return SEED
    try:
        return _known[name]
    except KeyError:
        raise DefinitionError(f"unknown definition {name!r}; built in: {', '.join(BUILT_IN)}, or a "
                              "path/to/definition.json") from None


def load(spec: str, root: Path | None = None) -> Definition:
    """A definition by built-in name or from a Definition file (``*.json``, relative to ``root``), registered."""
    if not spec.endswith(".json"):
        return by_name(spec)
    path = Path(spec)
    if not path.is_absolute():
        path = (root or Path.cwd()) / path
    if not path.is_file():
        raise DefinitionError(f"definition {spec}: no such file")
    return register(_read(path, str(path)))


def select(spec: str, root: Path | None = None) -> tuple[Definition, ...]:
    """``--definition``'s value: one name or file, a comma-separated list of them, or ``all`` (the built-in family)."""
    if spec.strip() == "all":
        return tuple(BUILT_IN.values())
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise DefinitionError("--definition is empty: name a definition, a path/to/definition.json, or all")
    chosen = tuple(dict.fromkeys(load(name, root) for name in names))
    return chosen
