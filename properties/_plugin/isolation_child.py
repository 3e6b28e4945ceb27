"""The child side of ``isolation``: the one process that imports and calls the implementation under test.

Started by ``isolation.Child`` (torch.multiprocessing, spawn); imports torch and the target and little else
(neither pytest nor Hypothesis nor the suite's oracle, bound or comparison). Its vocabulary over the pipe:

- it sends ``("ready", declarations)`` once the target is loaded, or ``("refused", text)``;
- then, for each ``("call", args, kwargs, ambient)`` it receives, it calls the target, waits for the device
  (``torch.cuda.synchronize``: work the call left on a side stream lands before the answer, not after the
  check) and sends ``("result", value)`` or ``("raised", description)``;
- ``("stop",)`` ends it, as does its parent's death (``PR_SET_PDEATHSIG``, and the pipe's end).

Its stdout and stderr go to a log file the parent reads when the child dies (``faulthandler`` writes a
segfault's Python stack there). The parent trusts nothing it sends: see ``isolation``.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import traceback
from typing import Any

PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:
    """The kernel kills this process when its parent dies, even while a call hangs (Linux; elsewhere the pipe's end
    still stops an idle child)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _redirect_output(log_path: str) -> None:
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    faulthandler.enable(sys.stderr)


def _describe(error: BaseException) -> dict[str, Any]:
    """An exception as plain text: its classes' names (the parent re-raises the nearest built-in one), message and
    traceback. Never the object itself: unpickling it would import the implementation's module in the parent."""
    return {"mro": [cls.__name__ for cls in type(error).__mro__ if cls.__module__ == "builtins"],
            "type": f"{type(error).__module__}.{type(error).__qualname__}", "message": str(error)[:20000],
            "traceback": "".join(traceback.format_exception(error))[-20000:]}


def _apply_ambient(torch, ambient: dict[str, Any]) -> None:
    """The parent's torch settings that change what a call computes (``checks.poisoned_allocations``)."""
    torch.utils.deterministic.fill_uninitialized_memory = ambient["fill_uninitialized_memory"]
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is not None:
        setter(ambient["deterministic"], warn_only=ambient["warn_only"])


def main(connection, launch: dict[str, Any]) -> None:
    """The child's life: load the target (``launch``: spec, root, device, definition, log), then answer calls."""
    _die_with_parent()
    _redirect_output(launch["log"])
    sys.argv = [launch.get("argv0", "impl")]
    import torch  # noqa: F401 - before the target: its reductions decode the tensors the parent sends
    import torch.multiprocessing  # noqa: F401

    from .target import declared_by, load_impl, resolve_device

    try:
        device = resolve_device(launch["device"])
        function = load_impl(launch["spec"], root=launch["root"])
        definition = launch.get("definition")
        if definition is not None and hasattr(function, "for_definition"):
            function = function.for_definition(definition)
        connection.send(("ready", declared_by(function)))
    except BaseException as error:  # noqa: BLE001 - told to the parent, which raises a usage error
        connection.send(("refused", _describe(error)))
        return
    _serve(connection, function, device)


def _serve(connection, function, device) -> None:
    import torch

    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message[0] != "call":
            return
        _, args, kwargs, ambient = message
        try:
            _apply_ambient(torch, ambient)
            value = function(*args, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            reply = ("result", value)
        except Exception as error:  # noqa: BLE001 - the implementation's error is the answer
            reply = ("raised", _describe(error))
        del args, kwargs
        try:
            connection.send(reply)
        except Exception as error:  # noqa: BLE001 - a result torch cannot send (a view of an odd storage...)
            connection.send(("raised", _describe(TypeError(f"the implementation's result could not be sent to "
                                                            f"the checking process: {error!r}"))))
