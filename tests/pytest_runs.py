"""Run the suite in a fresh pytest process, with an environment free of this run's settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Set by xdist or by this suite's plugin for its own workers: a nested run must not inherit them.
_INHERITED = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID", "PYTEST_ADDOPTS")


def clean_environment(**overrides: str) -> dict[str, str]:
    """This process's environment without xdist's and the suite's variables, plus ``overrides``. It keeps an xdist
    worker's share of the cores (``gpus.share_cores``): the nested run runs while the worker waits for it."""
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED and not k.startswith("GQA_DECODE_")}
    env.update(overrides)
    return env


def run_pytest(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m pytest ARGS`` from the repository root, without the cache provider."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env or clean_environment())


def run_module(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` from the repository root."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env or clean_environment())
