"""Build the few files of SGLang that its decode kernel needs, for a machine without network (a GPU host).

Usage (from the repository root, where pip can reach the package index)::

    python adapters/sglang_package.py                      # downloads the sglang 0.5.23 wheel (39 MB)
    python adapters/sglang_package.py --wheel FILE.whl --out .carry/sglang

The result, ``.carry/sglang/`` (git-ignored, about 264 KB), is a folder to put on ``PYTHONPATH``
(``FAMILY=1 bash benchmarks/gpu_session.sh reach`` does): the package's ``__init__`` files down to the
kernel module, the kernel module itself (``sglang/kernels/ops/attention/decode_attention.py``), the one
module it imports from its own folder (``score_mod.py``), ``sglang/srt/environ.py`` and the wheel's
``METADATA`` (so that ``importlib.metadata.version('sglang')`` answers).
``adapters/sglang_decode.py`` then loads the kernel file as it does from an installed wheel (stubbing
``sglang.srt.utils``); nothing of SGLang's server is carried or imported.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_VERSION = "0.5.23"
FILES = (
    "sglang/__init__.py",
    "sglang/kernels/__init__.py",
    "sglang/kernels/ops/__init__.py",
    "sglang/kernels/ops/attention/__init__.py",
    "sglang/kernels/ops/attention/decode_attention.py",
    "sglang/kernels/ops/attention/score_mod.py",
    "sglang/srt/environ.py",
)


def download(version: str, into: Path) -> Path:
    """The sglang wheel of ``version`` (no dependencies), downloaded into ``into``."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"sglang=={version}",
                    "-d", str(into)], check=True)
    return next(into.glob("sglang-*.whl"))


def build(wheel: Path, out: Path) -> int:
    """Extract ``FILES`` from ``wheel`` under ``out``; the bytes written."""
    with zipfile.ZipFile(wheel) as archive:
        missing = [name for name in FILES if name not in archive.namelist()]
        if missing:
            raise SystemExit(f"{wheel.name} has no {', '.join(missing)}: adapters/sglang_decode.py names the "
                             "module paths it knows")
        metadata = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        for name in (*FILES, *metadata):  # the metadata lets importlib.metadata report the version
            archive.extract(name, out)
    return sum((out / name).stat().st_size for name in (*FILES, *metadata))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="an sglang wheel already downloaded")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="the version to download without --wheel")
    parser.add_argument("--out", type=Path, default=Path(".carry/sglang"))
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        wheel = options.wheel or download(options.version, Path(scratch))
        written = build(wheel, options.out)
    print(f"{options.out}: {len(FILES)} files, {written / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
