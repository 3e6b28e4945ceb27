"""pytest plugin of the suite: options, Hypothesis profiles, device choice, markers, fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from properties import profiles, session
from properties.impl import DEFAULT_IMPL, ImplSpecError, load_impl

ROOT = Path(__file__).resolve().parent

profiles.register_profiles()
# The hypothesis plugin's --hypothesis-profile, when given, overrides this at configure time.
from hypothesis import settings  # noqa: E402

settings.load_profile(profiles.default_profile())

_OPTIONS = (
    # flag, environment variable, default, choices, help
    ("--impl", "GQA_DECODE_IMPL", DEFAULT_IMPL, None,
     "implementation under test: 'package.module:function' or 'path/to/file.py:function'"),
    ("--device", "GQA_DECODE_DEVICE", "auto", ("auto", "cpu", "cuda"),
     "where the kernel runs: cuda, cpu (Triton interpreter), or auto (cuda when available)"),
    ("--case-sizes", "GQA_DECODE_CASE_SIZES", None, tuple(profiles.CASE_SIZES),
     "size limits of generated cases; default small on cpu, large on cuda"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gqa-decode", "GQA paged-decode property suite")
    for flag, env, default, choices, text in _OPTIONS:
        group.addoption(
            flag, dest=flag.lstrip("-").replace("-", "_"), default=os.environ.get(env, default),
            choices=choices, metavar=None if choices else "TARGET", help=f"{text} (env {env})",
        )


def _resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device=cuda but torch sees no CUDA device; try --device=cpu")
    return torch.device(choice)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when the kernel runs in the interpreter")
    device = _resolve_device(config.option.device)
    if device.type == "cpu":
        # Must precede the import of any @triton.jit module.
        os.environ["TRITON_INTERPRET"] = "1"
    sizes = config.option.case_sizes or ("small" if device.type == "cpu" else "large")
    try:
        impl = load_impl(config.option.impl, root=ROOT)
    except ImplSpecError as error:
        raise pytest.UsageError(str(error)) from None
    session.configure(session.Session(
        impl_spec=config.option.impl, impl=impl, device=device, sizes=sizes, limits=profiles.CASE_SIZES[sizes],
    ))


def _profile_name() -> str:
    # get_current_profile_name() is recent; the GPU image may carry an older Hypothesis.
    getter = getattr(settings, "get_current_profile_name", None)
    return getter() if getter else getattr(settings, "_current_profile", "?")


def pytest_report_header(config: pytest.Config) -> list[str]:
    current = session.current()
    return [
        f"gqa-decode: impl={current.impl_spec} device={current.device} case-sizes={current.sizes} "
        f"hypothesis-profile={_profile_name()}"
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if session.current().device.type == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (kernel runs in the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the kernel under test runs on."""
    return session.current().device


@pytest.fixture(scope="session")
def impl():
    """The implementation under test (``--impl``)."""
    return session.current().impl
