"""Run the property suite against one corpus entry in a subprocess, and read what happened.

A mutant counts as killed only when pytest exits 1 with a failed property: a usage
error (exit 4), a collection error (2), an internal error (3) or a crashed process
(negative exit) is reported as such, never as a kill.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .materialise import ROOT, materialise
from .mutants import Mutant

__all__ = ["SuiteRun", "run_suite", "suite_command"]

_FAILED = re.compile(r"^FAILED (\S+)", re.MULTILINE)
# How Hypothesis introduces the reported example: "Failing test case" / "Failing explicit example" (6.1xx),
# "Falsifying example" / "Falsifying explicit example" (older releases).
_REPORTED = re.compile(r"Failing test case|Failing explicit example|Falsifying (?:explicit )?example")
# A DecodeCase's lengths, or a PrefillCase's key counts (Hypothesis may break its repr over lines).
_LENGTHS = re.compile(r"(?:DecodeCase\(lengths|PrefillCase\(q_lens=\([\d, ]*\),\s*kv_lens)=\(([\d, ]*)\)")


@dataclass(frozen=True)
class SuiteRun:
    """The outcome of the property suite on one mutant."""

    mutant: Mutant
    returncode: int | None  # None: timed out
    seconds: float  # wall time of the subprocess
    cpu_seconds: float | None  # its CPU time, as the child measured it; None when it crashed
    failed: tuple[str, ...]  # node ids of failed tests
    examples_to_failure: int | None  # of the first failed test; None when not a @given test
    first_example_to_failure: float | None  # seconds from the run's first example to its first failing one
    shrunk_lengths: tuple[int, ...] | None  # the falsifying case's lengths, when it is a DecodeCase
    output: str

    @property
    def killed(self) -> bool:
        return self.returncode == 1 and bool(self.failed)

    @property
    def verdict(self) -> str:
        if self.killed:
            return "killed"
        if self.returncode == 0:
            return "SURVIVED"
        if self.returncode is None:
            return "TIMEOUT"
        return f"ERROR (exit {self.returncode})"

    @property
    def batch(self) -> int | None:
        return None if self.shrunk_lengths is None else len(self.shrunk_lengths)

    @property
    def longest(self) -> int | None:
        return None if self.shrunk_lengths is None else max(self.shrunk_lengths, default=0)


def suite_command(mutant: Mutant, impl_spec: str, workdir: Path, *, device: str = "auto", shrink: bool = True,
                  explicit: bool = True, record: Path | None = None) -> list[str]:
    """The pytest command that runs the whole property suite (ci profile) against ``impl_spec``, one process,
    under the mutant's definition, stopping at the first failure; case files go under ``workdir``, no run report."""
    command = [
        sys.executable, "-m", "pytest", "properties", "-p", "no:cacheprovider", "-p", "tests.corpus.plugin",
        "-n0", "-x", "-q", "--hypothesis-profile=ci", f"--device={device}", f"--impl={impl_spec}",
        f"--contract={mutant.contract}",
        f"--failures-dir={Path(workdir) / ('failures-' + mutant.name)}", "--run-report=none",
    ]
    if mutant.definition:
        command.append(f"--definition={mutant.definition}")
    if mutant.first:
        command.append(f"--corpus-first={mutant.first}")
    if not shrink:
        command.append("--corpus-no-shrink")
    if not explicit:
        command.append("--corpus-no-explicit")
    if record is not None:
        command.append(f"--corpus-record={record}")
    return command


def _child_environment() -> dict[str, str]:
    # Drop the parent's pytest, xdist and suite settings: the child is a plain, single-process session.
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_", "GQA_DECODE_"))}


def _text(captured: bytes | str | None) -> str:
    if isinstance(captured, bytes):
        return captured.decode(errors="replace")
    return captured or ""


def _shrunk_lengths(output: str) -> tuple[int, ...] | None:
    """Lengths of the first DecodeCase after Hypothesis's last example report (the shrunk or explicit example);
    None when the failing test reported none (not a @given test, or no DecodeCase among its arguments)."""
    reports = list(_REPORTED.finditer(output))
    found = _LENGTHS.search(output, reports[-1].end()) if reports else None
    if found is None:
        return None
    return tuple(int(n) for n in found.group(1).replace(" ", "").split(",") if n)


def run_suite(
    mutant: Mutant, workdir: Path, *, device: str = "auto", shrink: bool = True, explicit: bool = True,
    timeout: float = 900.0,
) -> SuiteRun:
    """Materialise ``mutant`` under ``workdir`` and run the property suite against it.

    ``shrink=False`` skips Hypothesis's shrinking: the kill is found as fast, but the
    counterexample is the first failing one, not a minimal one. ``explicit=False``
    skips the suite's pinned ``@example``s, leaving generated examples alone.
    """
    workdir = Path(workdir)
    impl = materialise(mutant, workdir)
    with tempfile.NamedTemporaryFile(suffix=".json", dir=workdir, delete=False) as handle:
        record = Path(handle.name)
    started = time.perf_counter()
    command = suite_command(mutant, impl, workdir, device=device, shrink=shrink, explicit=explicit, record=record)
    try:
        result = subprocess.run(command, cwd=ROOT, env=_child_environment(), capture_output=True, text=True,
                                timeout=timeout)
        returncode, stdout, stderr = result.returncode, result.stdout, result.stderr
    except subprocess.TimeoutExpired as expired:
        returncode, stdout, stderr = None, _text(expired.stdout), _text(expired.stderr)
    seconds = time.perf_counter() - started
    output = stdout + stderr
    failed = tuple(_FAILED.findall(stdout)) if returncode is not None else ()
    records = json.loads(record.read_text() or "{}")
    first = records.get("tests", {}).get(failed[0], {}).get("first_failure") if failed else None
    return SuiteRun(
        mutant=mutant, returncode=returncode, seconds=seconds, cpu_seconds=records.get("cpu_seconds"),
        failed=failed,
        examples_to_failure=first, first_example_to_failure=records.get("first_example_to_failure"),
        shrunk_lengths=_shrunk_lengths(output) if failed else None, output=output,
    )
