"""Build a trimmed FlashInfer for a machine without network: only what the decode and prefill adapters compile.

Usage (from the repository root, where pip can reach the package index)::

    python adapters/flashinfer_package.py                 # downloads flashinfer-python 0.3.1's sdist
    python adapters/flashinfer_package.py --sdist FILE.tar.gz --out .carry/flashinfer

The result, ``.carry/flashinfer/`` (git-ignored), is a folder to put on ``PYTHONPATH``:
``flashinfer/`` (the Python package as the source distribution ships it) and ``flashinfer/data/``
laid out as an installed wheel lays it out (``include``, ``csrc``, ``cutlass/include``,
``cutlass/tools/util/include``, ``spdlog/include``), holding only the files the decode wrapper's
JIT modules include: the ``#include`` closure of its sources and templates, followed through
FlashInfer's, CUTLASS's and spdlog's headers. ``MANIFEST.txt`` lists every file and the total.

Which modules: ``BatchDecodeWithPagedKVCacheWrapper`` compiles ``batch_decode*`` (the CUDA-core decode
kernel: query groups 1, 2, 3, 4 and 8) and, with ``use_tensor_cores=True`` (any group; what engines
use for groups above 4), ``batch_prefill*`` (FlashAttention-2 templates, asked for by name on every GPU, so
FlashAttention-3's sm90 sources and CUTLASS never are). The same ``batch_prefill*`` sources serve the batch
prefill wrappers, paged and ragged, with ``backend="fa2"`` (adapters/flashinfer_prefill.py); their ``fa3``
backend, FlashInfer's own choice on sm90, would need the sm90 sources and CUTLASS's headers (about 21 MiB
more). ``--decode-only`` leaves the tensor-core (and so the prefill) sources out.

Why 0.3.1: its Python dependencies are all on the GPU image already (torch, ninja, numpy,
requests, jinja2, filelock, einops, click, tqdm, tabulate, packaging, and ``pynvml`` from
nvidia-ml-py; nvidia-cudnn-frontend is imported only by its cuDNN paths, inside a try), its JIT
builds ordinary torch extensions with the image's nvcc and ninja, and its ninja files already
look for CUDA 13's relocated CCCL headers. Releases from 0.4 on bind through apache-tvm-ffi and
ship as 100 MB wheels with eagerly imported dependencies (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

DEFAULT_VERSION = "0.3.1"
ROOT = Path(__file__).resolve().parent.parent

# sdist folder -> folder under flashinfer/data (what the package's build backend links there)
_DATA_DIRS = {
    "include": "include",
    "csrc": "csrc",
    "3rdparty/cutlass/include": "cutlass/include",
    "3rdparty/cutlass/tools/util/include": "cutlass/tools/util/include",
    "3rdparty/spdlog/include": "spdlog/include",
}
_DECODE_SOURCES = ("batch_decode.cu", "batch_decode_jit_pybind.cu", "batch_decode_customize_config.jinja",
                   "batch_decode_kernel_inst.jinja", "batch_decode_config.inc")
# The decode wrapper's tensor-core path asks for the "fa2" prefill module by name (flashinfer/decode.py, plan), on
# every GPU: FlashAttention-3's sm90 sources and CUTLASS's cute are never compiled for decode.
_TENSOR_CORE_SOURCES = ("batch_prefill.cu", "batch_prefill_jit_pybind.cu", "batch_prefill_customize_config.jinja",
                        "batch_prefill_paged_kernel_inst.jinja", "batch_prefill_ragged_kernel_inst.jinja",
                        "batch_prefill_config.inc")
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
# Headers the Python side writes into generated sources (variant declarations): "#include<flashinfer/...>"
_INCLUDE_IN_PYTHON = re.compile(r'#include\s*[<"]([^">]+)[">]')


def download(version: str, into: Path) -> Path:
    """flashinfer-python's source distribution, fetched with pip (no dependencies, nothing built)."""
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "--no-build-isolation",
                    f"flashinfer-python=={version}", "-d", str(into)], check=True)
    found = sorted(into.glob(f"flashinfer_python-{version}.tar.gz"))
    if not found:
        raise SystemExit(f"pip saved no flashinfer_python-{version}.tar.gz in {into}")
    return found[0]


def _unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as archive:
        archive.extractall(into, filter="data")
    (top,) = [p for p in into.iterdir() if p.is_dir()]
    return top


def _resolve(name: str, roots: list[Path]) -> Path | None:
    for root in roots:
        candidate = root / name
        if candidate.is_file():
            return candidate
    return None


def include_closure(sources: list[Path], roots: list[Path]) -> set[Path]:
    """``sources`` and every header they include, transitively, that lies under ``roots`` (a file's own folder
    first, as the preprocessor looks for quoted includes). Headers found nowhere (CUDA, torch, the C++ library) are
    left out; conditional includes are followed as if taken (a superset)."""
    seen: set[Path] = set()
    pending = list(sources)
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _INCLUDE.findall(path.read_text(errors="replace")):
            found = _resolve(name, [path.parent, *roots])
            if found is not None and found not in seen:
                pending.append(found)
    return seen


def _python_includes(package: Path, roots: list[Path]) -> list[Path]:
    """Headers the JIT's Python writes into generated sources, except Hopper's (FlashAttention-3 variants)."""
    names = set()
    for module in (package / "jit").rglob("*.py"):
        names.update(name for name in _INCLUDE_IN_PYTHON.findall(module.read_text()) if "/hopper/" not in name)
    return [found for name in sorted(names) if (found := _resolve(name, roots)) is not None]


def build(sdist: Path, out: Path, *, tensor_cores: bool = True) -> list[tuple[str, int]]:
    """Write the trimmed package into ``out``; returns (path under out, bytes) for every file written."""
    with tempfile.TemporaryDirectory() as scratch:
        top = _unpack(sdist, Path(scratch))
        roots = [top / "include", top / "csrc", top / "3rdparty/cutlass/include",
                 top / "3rdparty/cutlass/tools/util/include", top / "3rdparty/spdlog/include"]
        names = _DECODE_SOURCES + (_TENSOR_CORE_SOURCES if tensor_cores else ())
        sources = [top / "csrc" / name for name in names if (top / "csrc" / name).is_file()]
        sources += _python_includes(top / "flashinfer", roots)
        needed = include_closure(sources, roots)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(top / "flashinfer", out / "flashinfer",
                        ignore=shutil.ignore_patterns("__pycache__", "data", "*.so"))
        for path in sorted(needed):
            folder = next(f for f in _DATA_DIRS if path.is_relative_to(top / f))
            target = out / "flashinfer" / "data" / _DATA_DIRS[folder] / path.relative_to(top / folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        for folder in _DATA_DIRS.values():  # the JIT names each include folder; let each exist
            (out / "flashinfer" / "data" / folder).mkdir(parents=True, exist_ok=True)
    written = sorted((str(p.relative_to(out)), p.stat().st_size) for p in out.rglob("*") if p.is_file())
    total = sum(size for _, size in written)
    lines = [f"{size}\t{name}" for name, size in written] + [f"{total}\ttotal ({len(written)} files)"]
    (out / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=DEFAULT_VERSION, help="flashinfer-python version (default %(default)s)")
    parser.add_argument("--sdist", type=Path, help="an already downloaded flashinfer_python-VERSION.tar.gz")
    parser.add_argument("--out", type=Path, default=ROOT / ".carry" / "flashinfer", help="output folder")
    parser.add_argument("--decode-only", action="store_true", help="leave out the tensor-core (prefill) sources")
    args = parser.parse_args(argv)
    sdist = args.sdist or download(args.version, ROOT / ".carry" / "downloads")
    written = build(sdist, args.out, tensor_cores=not args.decode_only)
    total = sum(size for _, size in written)
    print(f"{args.out}: {len(written)} files, {total / 2**20:.1f} MiB (list: {args.out / 'MANIFEST.txt'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
