"""The contract as data: a ``Definition`` of one GQA attention kernel, read from a FlashInfer-Bench Definition file.

Every layer of the suite (builder, strategies, oracle, bound, checks, case files, replay,
report) reads the shape of the call from one ``Definition``; none keeps a constant of its
own. Three op types, each a kind of Definition file of the benchmark: decode over a paged KV
cache (``op_type`` "gqa_paged", one query per sequence), causal prefill over a paged KV cache
("gqa_paged" with ``qo_indptr``) and causal prefill over ragged K/V ("gqa_ragged"). The sets
FlashInfer-Bench's ``flashinfer-trace`` data set defines are built in, as Definition files in
``definitions/`` beside this module; any other file of these kinds (other head counts, head dim
or page size) is read the same way, and anything else is refused with a message that names what
is not supported.

This module imports neither torch nor Triton: an xdist controller resolves ``--definition``
before it starts its workers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "ALL_BUILT_IN", "BUILT_IN", "DECODE", "Definition", "DefinitionError", "OP_TYPES", "PAGED_PREFILL", "PREFILL",
    "RAGGED_PREFILL", "SEED", "SEED_NAME", "SELECTORS", "built_in", "by_name", "check_op_types", "from_json", "load",
    "register", "select",
]

SEED_NAME = "gqa_paged_decode_h32_kv4_d128_ps1"
_BUILT_IN_DIR = Path(__file__).resolve().parent / "definitions"

# The op types, in the order built-ins are listed.
DECODE, PAGED_PREFILL, RAGGED_PREFILL = "decode", "paged_prefill", "ragged_prefill"
OP_TYPES = (DECODE, PAGED_PREFILL, RAGGED_PREFILL)
PREFILL = (PAGED_PREFILL, RAGGED_PREFILL)
# --definition's words for sets of built-ins: all of them, or those of some op types.
SELECTORS = {"all": OP_TYPES, "decode": (DECODE,), "prefill": PREFILL, "paged_prefill": (PAGED_PREFILL,),
             "ragged_prefill": (RAGGED_PREFILL,)}

_PAGED_HEADS = ("num_qo_heads", "num_kv_heads", "head_dim", "page_size")
_CACHE = (["num_pages", "page_size", "num_kv_heads", "head_dim"], "bfloat16")
_SCALE = (None, "float32")
_QUERY_ROWS = {  # prefill's outputs: one row per query token
    "output": (["total_q", "num_qo_heads", "head_dim"], "bfloat16"),
    "lse": (["total_q", "num_qo_heads"], "float32"),
}


class _Format(NamedTuple):
    """What a Definition file of one op type holds. ``inputs`` are in call order; ``kv_last_page_len`` is taken
    only where pages hold several tokens. Constraints are whitespace-free; the builder meets them by construction."""

    field: str  # the file's op_type
    words: str  # for messages
    name: re.Pattern  # the benchmark's names: h{H} kv{H_kv} d{D} [ps{S}]
    constants: tuple[str, ...]
    variables: tuple[str, ...]
    inputs: dict[str, tuple]
    outputs: dict[str, tuple]
    constraints: tuple[str, ...]  # as to_json writes them
    also_known: frozenset[str] = frozenset()  # constraints accepted besides those
    also_shaped: dict[str, tuple] = {}  # an input's other accepted (shape, dtype)


_FORMATS = {
    DECODE: _Format(
        field="gqa_paged", words="GQA paged decode",
        name=re.compile(r"gqa_paged_decode_h(\d+)_kv(\d+)_d(\d+)_ps(\d+)"),
        constants=_PAGED_HEADS, variables=("batch_size", "num_pages", "len_indptr", "num_kv_indices"),
        inputs={
            "q": (["batch_size", "num_qo_heads", "head_dim"], "bfloat16"), "k_cache": _CACHE, "v_cache": _CACHE,
            "kv_indptr": (["len_indptr"], "int32"), "kv_indices": (["num_kv_indices"], "int32"),
            "kv_last_page_len": (["batch_size"], "int32"), "sm_scale": _SCALE,
        },
        outputs={
            "output": (["batch_size", "num_qo_heads", "head_dim"], "bfloat16"),
            "lse": (["batch_size", "num_qo_heads"], "float32"),
        },
        constraints=("len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"),
    ),
    PAGED_PREFILL: _Format(
        field="gqa_paged", words="GQA paged causal prefill",
        name=re.compile(r"gqa_paged_prefill_causal_h(\d+)_kv(\d+)_d(\d+)_ps(\d+)"),
        constants=_PAGED_HEADS, variables=("batch_size", "total_q", "num_pages", "len_indptr", "num_kv_indices"),
        inputs={
            "q": (["total_q", "num_qo_heads", "head_dim"], "bfloat16"), "k_cache": _CACHE, "v_cache": _CACHE,
            "qo_indptr": (["len_indptr"], "int32"), "kv_indptr": (["len_indptr"], "int32"),
            "kv_indices": (["num_kv_indices"], "int32"), "kv_last_page_len": (["batch_size"], "int32"),
            "sm_scale": _SCALE,
        },
        outputs=_QUERY_ROWS,
        constraints=("total_q == qo_indptr[-1].item()", "num_kv_indices == kv_indptr[-1].item()"),
        also_known=frozenset({"len_indptr==batch_size+1"}),
        # Six of the benchmark's files declare one entry per indptr entry; the call passes one per sequence.
        also_shaped={"kv_last_page_len": (["len_indptr"], "int32")},
    ),
    RAGGED_PREFILL: _Format(
        field="gqa_ragged", words="GQA ragged causal prefill",
        name=re.compile(r"gqa_ragged_prefill_causal_h(\d+)_kv(\d+)_d(\d+)"),
        constants=("num_qo_heads", "num_kv_heads", "head_dim"),
        variables=("batch_size", "total_q", "total_kv", "len_indptr"),
        inputs={
            "q": (["total_q", "num_qo_heads", "head_dim"], "bfloat16"),
            "k": (["total_kv", "num_kv_heads", "head_dim"], "bfloat16"),
            "v": (["total_kv", "num_kv_heads", "head_dim"], "bfloat16"),
            "qo_indptr": (["len_indptr"], "int32"), "kv_indptr": (["len_indptr"], "int32"), "sm_scale": _SCALE,
        },
        outputs=_QUERY_ROWS,
        constraints=("total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"),
        also_known=frozenset({"len_indptr==batch_size+1"}),
    ),
}


class DefinitionError(ValueError):
    """A definition the suite cannot test: not of a known op type, or malformed; the message names what."""


@dataclass(frozen=True)
class Definition:
    """One GQA attention contract: its op type, name, constants and argument list.

    ``op_type`` is ``DECODE``, ``PAGED_PREFILL`` or ``RAGGED_PREFILL``; ``page_size`` is 0 for ragged prefill
    (no page pool). ``reference`` is the Python source of the definition file's own float32 ``run`` (checked
    against the float64 oracle by the suite's tests); ``origin`` is ``built-in`` or the file it was read from.
    """

    name: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    description: str = field(default="", compare=False)
    reference: str = field(default="", repr=False, compare=False)
    origin: str = field(default="built-in", compare=False)
    op_type: str = DECODE

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
    def prefill(self) -> bool:
        """Causal prefill (paged or ragged): several queries per sequence, ``qo_indptr`` delimits them."""
        return self.op_type in PREFILL

    @property
    def arguments(self) -> tuple[str, ...]:
        """The implementation's positional arguments, in order."""
        return tuple(name for name in _FORMATS[self.op_type].inputs if name != "kv_last_page_len" or self.paged)

    @property
    def page_elements(self) -> int:
        """Elements of one K (or V) page: the page stride of a plain pool."""
        return self.page_size * self.num_kv_heads * self.head_dim

    def signature(self) -> str:
        return f"run({', '.join(self.arguments)}) -> (output, lse)"

    def summary(self) -> str:
        """One line for headers and reports."""
        pages = f"page size {self.page_size}" if self.op_type != RAGGED_PREFILL else "ragged K/V"
        kind = "" if self.op_type == DECODE else f"{_FORMATS[self.op_type].words}, "
        return (f"{self.name} ({kind}{self.num_qo_heads} query heads over {self.num_kv_heads} KV heads, head dim "
                f"{self.head_dim}, {pages})")

    def to_json(self) -> dict[str, Any]:
        """The definition as a FlashInfer-Bench Definition object (what ``from_json`` reads back)."""
        form = _FORMATS[self.op_type]
        values = {name: getattr(self, name) for name in form.constants}
        inputs = {name: {"shape": form.inputs[name][0], "dtype": form.inputs[name][1]} for name in self.arguments}
        shapes = [spec["shape"] for spec in inputs.values()] + [shape for shape, _ in form.outputs.values()]
        used = {axis for shape in shapes for axis in shape or ()}
        axes = {name: {"type": "const", "value": values[name]} for name in form.constants}
        axes.update({name: {"type": "var"} for name in form.variables if name in used})
        return {
            "name": self.name, "op_type": form.field, "description": self.description, "axes": axes,
            "inputs": inputs,
            "outputs": {name: {"shape": shape, "dtype": dtype} for name, (shape, dtype) in form.outputs.items()},
            "constraints": list(form.constraints),
            "reference": self.reference,
        }


def _refuse(where: str, what: str) -> DefinitionError:
    return DefinitionError(f"definition {where}: {what}")


def _op_type(data: dict, name: str, where: str) -> str:
    """The op type a file describes: its ``op_type`` field, and for "gqa_paged" whether it takes ``qo_indptr``;
    refused where its name or its ``stage:`` tag says otherwise."""
    given = data.get("op_type")
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    if given == "gqa_ragged":
        op_type = RAGGED_PREFILL
    elif given == "gqa_paged":
        op_type = PAGED_PREFILL if "qo_indptr" in inputs else DECODE
    else:
        raise _refuse(where, f"op_type {given!r} is not supported (only 'gqa_paged' decode and causal prefill, "
                             "'gqa_ragged' causal prefill)")
    said = "prefill" if "prefill" in name else "decode" if "decode" in name else None
    if said == "prefill" and "causal" not in name:
        raise _refuse(where, "a prefill whose name does not say causal is not supported (only causal prefill, "
                             "bottom-right aligned)")
    tags = data.get("tags") if isinstance(data.get("tags"), list) else []
    stages = [tag[len("stage:"):] for tag in tags if isinstance(tag, str) and tag.startswith("stage:")]
    kind = "prefill" if op_type in PREFILL else "decode"
    for claim, source in ((said, "its name"), *((stage, f"its tag 'stage:{stage}'") for stage in stages)):
        if claim in ("prefill", "decode") and claim != kind:
            raise _refuse(where, f"{source} says {claim} but its op_type {given!r} and inputs are those of "
                                 f"{_FORMATS[op_type].words}" + ("" if kind == "prefill" else " (no qo_indptr)"))
    return op_type


def _constants(data: dict, form: _Format, where: str) -> dict[str, int]:
    axes = data.get("axes")
    if not isinstance(axes, dict):
        raise _refuse(where, "'axes' must be an object of axis name to {'type': 'const' | 'var', ...}")
    unknown = sorted(set(axes) - set(form.constants) - set(form.variables))
    if unknown:
        raise _refuse(where, f"axes {unknown} are not those of {form.words} (not supported)")
    constants = {}
    for name in form.constants:
        axis = axes.get(name)
        if not isinstance(axis, dict) or axis.get("type") != "const":
            raise _refuse(where, f"axis {name!r} must be a const (a variable {name} is not supported)")
        value = axis.get("value")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _refuse(where, f"axis {name!r} must have a positive integer value, got {value!r}")
        constants[name] = value
    for name in form.variables:
        if name in axes and (not isinstance(axes[name], dict) or axes[name].get("type") != "var"):
            raise _refuse(where, f"axis {name!r} must be a var (a fixed {name} is not supported)")
    if constants["num_qo_heads"] % constants["num_kv_heads"]:
        raise _refuse(where, f"num_qo_heads={constants['num_qo_heads']} is not a multiple of "
                             f"num_kv_heads={constants['num_kv_heads']}")
    return constants


def _check_tensors(kind: str, given: Any, form: _Format, order: list[str], where: str) -> None:
    if not isinstance(given, dict):
        raise _refuse(where, f"'{kind}' must be an object of name to {{'shape', 'dtype'}}")
    if list(given) != order:
        raise _refuse(where, f"{kind} {list(given)} are not supported: {form.words} takes {order}, in that order")
    expected = form.inputs if kind == "inputs" else form.outputs
    for name in order:
        spec = given[name] if isinstance(given[name], dict) else {}
        got_shape = spec.get("shape")
        if got_shape == []:  # a scalar written as an empty shape
            got_shape = None
        accepted = [expected[name], *([form.also_shaped[name]] if name in form.also_shaped else [])]
        if (got_shape, spec.get("dtype")) not in [(shape, dtype) for shape, dtype in accepted]:
            shape, dtype = expected[name]
            raise _refuse(where, f"{kind[:-1]} {name!r} is shape {got_shape} {spec.get('dtype')}; only "
                                 f"{shape} {dtype} is supported")


def _check_constraints(data: dict, form: _Format, where: str) -> None:
    known = {c.replace(" ", "") for c in form.constraints} | form.also_known
    constraints = data.get("constraints") or []
    if not isinstance(constraints, list):
        raise _refuse(where, "'constraints' must be a list of Python expressions")
    unknown = [c for c in constraints if not isinstance(c, str) or c.replace(" ", "") not in known]
    if unknown:
        raise _refuse(where, f"constraints {unknown} are not supported (known: {sorted(known)})")


def from_json(data: Any, origin: str = "built-in") -> Definition:
    """The ``Definition`` a FlashInfer-Bench Definition object describes; ``DefinitionError`` naming what is not
    supported for anything other than GQA paged decode, paged causal prefill or ragged causal prefill with bf16
    inputs."""
    where = repr(data.get("name")) if isinstance(data, dict) else origin
    if not isinstance(data, dict):
        raise _refuse(where, "expected a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _refuse(where, "'name' must be a non-empty string")
    op_type = _op_type(data, name, where)
    form = _FORMATS[op_type]
    constants = _constants(data, form, where)
    arguments = [n for n in form.inputs if n != "kv_last_page_len" or constants.get("page_size", 0) > 1]
    _check_tensors("inputs", data.get("inputs"), form, arguments, where)
    _check_tensors("outputs", data.get("outputs"), form, list(form.outputs), where)
    _check_constraints(data, form, where)
    named = form.name.fullmatch(name)
    if named and tuple(map(int, named.groups())) != tuple(constants[c] for c in form.constants):
        said = " ".join(f"{word}{number}" for word, number in zip(("h", "kv", "d", "ps"), named.groups()))
        raise _refuse(where, f"its name says {said} but its axes say "
                             + " ".join(f"{c}={constants[c]}" for c in form.constants))
    reference = data.get("reference") or ""
    if not isinstance(reference, str):
        raise _refuse(where, "'reference' must be Python source text")
    return Definition(name=name, description=str(data.get("description") or ""), reference=reference,
                      origin=origin, op_type=op_type, **{"page_size": 0, **constants})


def _read(path: Path, origin: str) -> Definition:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise DefinitionError(f"definition {path}: cannot read it ({error})") from None
    except json.JSONDecodeError as error:
        raise DefinitionError(f"definition {path}: not JSON ({error})") from None
    return from_json(data, origin)


# Every built-in definition of every op type, by op type, then page size and head counts.
ALL_BUILT_IN: dict[str, Definition] = {
    definition.name: definition
    for definition in sorted((_read(path, "built-in") for path in _BUILT_IN_DIR.glob("*.json")),
                             key=lambda d: (OP_TYPES.index(d.op_type), d.page_size, d.num_qo_heads,
                                            d.num_kv_heads, d.head_dim))
}


def built_in(*op_types: str) -> dict[str, Definition]:
    """The built-in definitions of ``op_types`` (all of them where none is named), by name."""
    unknown = sorted(set(op_types) - set(OP_TYPES))
    if unknown:
        raise DefinitionError(f"op types {unknown} are unknown (known: {', '.join(OP_TYPES)})")
    wanted = op_types or OP_TYPES
    return {name: d for name, d in ALL_BUILT_IN.items() if d.op_type in wanted}


# The decode family: what the decode layers (builder, strategies, kernel, adapters) iterate. Prefill definitions
# are in ALL_BUILT_IN and ``built_in(PAGED_PREFILL, RAGGED_PREFILL)``; the property suite takes every op type.
BUILT_IN: dict[str, Definition] = built_in(DECODE)
SEED = BUILT_IN[SEED_NAME]
_known: dict[str, Definition] = dict(ALL_BUILT_IN)


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
        raise DefinitionError(f"unknown definition {name!r}; built in: {', '.join(ALL_BUILT_IN)}; or one of "
                              f"{', '.join(SELECTORS)}; or a path/to/definition.json") from None


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


def _words(op_types: Iterable[str]) -> str:
    return " and ".join(_FORMATS[op].words for op in op_types)


def check_op_types(chosen: Iterable[Definition], op_types: tuple[str, ...] = OP_TYPES,
                   reason: str = "not supported here") -> None:
    """``DefinitionError`` naming the first of ``chosen`` whose op type is not one of ``op_types``, and why."""
    for definition in chosen:
        if definition.op_type not in op_types:
            raise DefinitionError(f"definition {definition.name!r} is {_FORMATS[definition.op_type].words}; only "
                                  f"{_words(op_types)} definitions are taken here: {reason}")


def select(spec: str, root: Path | None = None, op_types: tuple[str, ...] = OP_TYPES,
           reason: str = "not supported here") -> tuple[Definition, ...]:
    """``--definition``'s value: a comma-separated list of names, files and selectors (``SELECTORS``: ``all``,
    every built-in of ``op_types``; ``decode``, ``prefill``, ``paged_prefill``, ``ragged_prefill``, the built-ins
    of those op types). A caller that takes only some op types names them (``op_types``): a name, file or selector
    of another is a ``DefinitionError`` saying ``reason``."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise DefinitionError("--definition is empty: name a definition, a path/to/definition.json, or "
                              + ", ".join(SELECTORS))
    chosen: list[Definition] = []
    for part in parts:
        if part not in SELECTORS:
            chosen.append(load(part, root))
            continue
        wanted = tuple(op for op in SELECTORS[part] if op in op_types) if part == "all" else SELECTORS[part]
        outside = [op for op in wanted if op not in op_types]
        if outside:
            raise DefinitionError(f"--definition={part} selects {_words(outside)} definitions; only "
                                  f"{_words(op_types)} definitions are taken here: {reason}")
        if wanted:  # built_in() of no op type would be all of them
            chosen.extend(built_in(*wanted).values())
    check_op_types(chosen, op_types, reason)
    return tuple(dict.fromkeys(chosen))
