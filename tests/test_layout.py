"""The layout: which folder may import which, read from the source with ``ast`` (nothing here imports the suite).

``LAYOUT`` is the one table of the folders and what each may import; docs/architecture.md shows the same table
(``test_the_architecture_doc_shows_this_table``). Imports inside functions count as much as those at the top:
an import moved into a function to dodge a circle still makes one, among folders and among modules alike.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "gqa_decode_fuzz"

# Folder -> the folders its code may import, lowest layer first. The contract (kernel, reference) imports no other
# folder; each layer above imports only layers below it. kernel/ is imported by the engine alone (its interpreter
# layer, for any Triton kernel on the CPU): everything else reaches the kernel as the ``--impl`` target.
LAYOUT: dict[str, tuple[str, ...]] = {
    "kernel": (),
    "reference": (),
    "adapters": ("reference",),
    "generation": ("reference",),
    "engine": ("kernel", "reference", "generation"),
    "record": ("reference", "generation", "engine"),
    "runner": ("reference", "generation", "engine", "record"),
    "properties": ("reference", "generation", "engine", "record", "runner"),
    "cli": ("reference", "generation", "engine", "record", "runner"),
}
# Outside the table: benchmarks/ and tests/ may import anything, private names included (they probe the insides).

DOC = ROOT / "docs" / "architecture.md"
MAX_SHARE = 1 / 3  # of the code's lines in any one folder


def _python_files(folder: str) -> list[Path]:
    return sorted(path for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts)


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imported(path: Path) -> list[tuple[int, str, str | None]]:
    """Each import in ``path``, at any depth: (line, module as a dotted name from the namespace, name or None).
    Relative imports are resolved; ``importlib.import_module("gqa_decode_fuzz....")`` with a literal counts too."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join([NAMESPACE, *base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found += [(node.lineno, module, alias.name) for alias in node.names]
        elif (isinstance(node, ast.Call) and "import_module" in (getattr(node.func, "attr", None), getattr(
                node.func, "id", None)) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value, None))
    return found


def _target_folder(module: str, name: str | None) -> tuple[str | None, list[str]]:
    """The folder an import reaches and the parts of its path below the namespace (the name imported last)."""
    parts = module.split(".")
    if parts[0] != NAMESPACE:
        return (parts[0], parts) if parts[0] in LAYOUT else (None, [])
    parts = parts[1:] + ([name] if name else [])
    return (parts[0] if parts else None), parts


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _imports() -> list[tuple[str, str, str, list[str], bool]]:
    """(importing folder, imported folder, "path:line", parts, namespaced) for every import between two folders."""
    edges = []
    for folder in LAYOUT:
        for path in _python_files(folder):
            for line, module, name in _imported(path):
                target, parts = _target_folder(module, name)
                if target in LAYOUT and target != folder:
                    where = f"{path.relative_to(ROOT)}:{line}"
                    edges.append((folder, target, where, parts, module.split(".")[0] == NAMESPACE))
    return edges


def _graph(pairs) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {folder: set() for folder in LAYOUT}
    for importer, imported in pairs:
        graph[importer].add(imported)
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (its folders in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_circle_among_the_folders():
    graph = _graph((importer, imported) for importer, imported, *_ in _imports())
    circle = _circle(graph)
    if circle:
        steps = {(a, b) for a, b in zip(circle, circle[1:])}
        lines = [f"  {where}: {a} -> {b}" for a, b, where, *_ in _imports() if (a, b) in steps]
        raise AssertionError("import circle " + " -> ".join(circle) + ":\n" + "\n".join(lines))


def test_the_table_itself_has_no_circle():
    assert _circle(_graph((a, b) for a, imported in LAYOUT.items() for b in imported)) is None


def test_each_folder_imports_only_what_the_table_allows():
    wrong = [f"  {where}: {importer} imports {imported} (the table allows {', '.join(LAYOUT[importer]) or 'none'})"
             for importer, imported, where, *_ in _imports() if imported not in LAYOUT[importer]]
    assert not wrong, "imports outside the table (tests/test_layout.py LAYOUT):\n" + "\n".join(wrong)


def test_other_folders_are_imported_through_the_namespace():
    bare = [f"  {where}: import {NAMESPACE}.{'.'.join(parts)}, not {'.'.join(parts)}"
            for _, _, where, parts, namespaced in _imports() if not namespaced]
    assert not bare, "a folder imported by its bare name (two copies of one module):\n" + "\n".join(bare)


def test_no_private_name_is_imported_from_another_folder():
    private = [f"  {where}: {'.'.join(parts)} ({importer} from {imported})"
               for importer, imported, where, parts, _ in _imports() if any(map(_is_private, parts[1:]))]
    assert not private, "private names imported across folders:\n" + "\n".join(private)


def _code_lines() -> dict[str, int]:
    """Lines of Python per folder of the code: the table's and benchmarks/ (not tests/, docs/ or build output)."""
    return {folder: sum(len(path.read_text(encoding="utf-8").splitlines()) for path in _python_files(folder))
            for folder in (*LAYOUT, "benchmarks")}


def test_no_folder_holds_more_than_a_third_of_the_code():
    counts = _code_lines()
    total = sum(counts.values())
    big = {folder: f"{lines} of {total} lines" for folder, lines in counts.items() if lines > MAX_SHARE * total}
    assert not big, f"folders over a third of the code: {big}"


def _doc_table() -> dict[str, tuple[set[str], set[str]]]:
    """docs/architecture.md's layout table: folder -> (what it may import, what may import it)."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        folder = re.fullmatch(r"`(\w+)/`", cells[0]) if len(cells) == 4 else None
        if folder and folder[1] in LAYOUT:
            rows[folder[1]] = tuple(set(re.findall(r"`(\w+)/?`", cell)) for cell in cells[2:])
    return rows


def test_the_architecture_doc_shows_this_table():
    expected = {folder: (set(imported), {other for other, its in LAYOUT.items() if folder in its})
                for folder, imported in LAYOUT.items()}
    assert _doc_table() == expected, "docs/architecture.md's table (folder | role | imports | imported by) " \
        "differs from tests/test_layout.py LAYOUT"


TYPED_PARAMETERS = ("definition", "case")  # each has its real type: reference's Definition, generation's cases


def test_no_signature_leaves_a_definition_or_a_case_untyped_as_any():
    loose = []
    for folder in LAYOUT:
        for path in _python_files(folder):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                arguments = node.args.args + node.args.kwonlyargs if isinstance(
                    node, ast.FunctionDef | ast.AsyncFunctionDef) else []
                fields = [node.target] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) else []
                for name, annotation in [(a.arg, a.annotation) for a in arguments] + \
                        [(f.id, node.annotation) for f in fields]:
                    if name in TYPED_PARAMETERS and isinstance(annotation, ast.Name) and annotation.id == "Any":
                        loose.append(f"  {path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {name}: Any")
    assert not loose, "a definition or case typed as Any (use Definition, DecodeCase, PrefillCase or Case):\n" + \
        "\n".join(loose)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the suite's modules it imports (at any depth, type-checking imports included)."""
    imported = {}
    for folder in LAYOUT:
        for path in _python_files(folder):
            names = {f"{module}.{name}" if name else module for _, module, name in _imported(path)}
            imported[".".join([NAMESPACE, *_module_name(path)])] = names
    modules = set(imported)

    def resolved(name: str) -> str | None:  # "pkg.mod.func" -> "pkg.mod"; None outside the suite
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {module: {resolved(name) for name in names} - {None, module} for module, names in imported.items()}


def test_no_circle_among_the_modules():
    graph, state, circles = _module_graph(), {}, []  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                circles.append(" -> ".join([*path[path.index(other):], other]))
            elif other not in state:
                visit(other, [*path, other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "modules that import each other (through a function or TYPE_CHECKING too):\n  " + \
        "\n  ".join(circles)
