"""The child side of ``isolation``: the one process that imports and calls the implementation under test.

Started by ``isolation.Child`` (torch.multiprocessing, spawn); imports torch and the target and little else
(neither pytest nor Hypothesis nor the suite's oracle, bound or comparison). Its vocabulary over the pipe:

- it sends ``("ready", declarations)`` once the target is loaded, or ``("refused", text)``;
- ``("buffers", {device: buffer})`` hands it the parent's input buffers (``arena``), new or grown, which it keeps;
- then, for each ``("call", definition, args, kwargs, ambient)`` it receives (an input either a tensor or an
  ``arena.ArenaSlot`` in a buffer), it calls the target, waits for the device
  (``torch.cuda.synchronize``: work the call left on a side stream lands before the answer, not after the
  check) and sends ``("result", value)`` or ``("raised", description)``;
- ``("stop",)`` ends it, as does its parent's death (``PR_SET_PDEATHSIG``, and the pipe's end).

Its stdout and stderr go to a log file the parent reads when the child dies (``faulthandler`` writes a
segfault's Python stack there). The parent trusts nothing it sends: see ``isolation``.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import traceback
from typing import Any

from . import devices
from .process_end import end_process

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


def _storage_copy(tensor, copies: dict, share: bool):
    """``tensor`` as the same view of a copy of its whole storage (one copy per storage, so inputs that share a
    storage share the copy too); in shared memory with ``share``."""
    import torch

    storage = tensor.untyped_storage()
    key = storage.data_ptr()
    if key not in copies:
        copy = storage.clone()
        copies[key] = (storage, copy.share_memory_() if share else copy)
    view = torch.empty((0,), dtype=tensor.dtype, device=tensor.device)
    return view.set_(copies[key][1], tensor.storage_offset(), tensor.size(), tensor.stride())


def copied(value: Any, copies: dict, device_type: str) -> Any:
    """``value`` (an argument, or a tuple, list or dict of them) with each tensor on ``device_type`` replaced by the
    same view of a copy of its storage (``copies`` maps each storage to its copy, for ``copy_back``). The parent
    sends CPU inputs of a call too large for its buffers (``arena``) so, in shared memory; a sanitized CUDA child
    makes its own, each an allocation of its own."""
    import torch

    from .arena import mapped

    def copy(tensor):
        if tensor.device.type != device_type or tensor.layout != torch.strided:
            return tensor
        return _storage_copy(tensor, copies, share=device_type == "cpu")

    return mapped(value, copy)


def copy_back(copies: dict) -> None:
    """The writes into the copies, made in the originals: the call's effect on its inputs, as it would be in-process."""
    import torch

    from .arena import bytes_of

    for original, copy in copies.values():
        mine, theirs = bytes_of(original), bytes_of(copy)
        if not torch.equal(mine, theirs):
            mine.copy_(theirs)


def main(connection, launch: dict[str, Any]) -> None:
    """The child's life: load the target (``launch``: spec, root, device, log, sanitize), then answer calls."""
    _die_with_parent()
    _redirect_output(launch["log"])
    sys.argv = [launch.get("argv0", "impl")]
    import torch  # before the target: its reductions decode the tensors the parent sends
    import torch.multiprocessing  # noqa: F401

    from .target import load_callable, resolve_device  # after the redirect: its output goes to the log

    try:
        device = resolve_device(launch["device"])
        function, declared = load_callable(launch["spec"], root=launch["root"])
        if device.type == "cuda":  # the context now, within the start's deadline, not in the first call's
            torch.ones(1, device=device).add_(1)
            torch.cuda.synchronize(device)
        connection.send(("ready", declared))
    except BaseException as error:  # noqa: BLE001 - told to the parent, which raises a usage error
        connection.send(("refused", _describe(error)))
        return
    sanitized = bool(launch.get("sanitize"))
    if "triton" in sys.modules and not sanitized:  # a Triton target: Triton's start while the parent starts
        _warm_triton(device)
    _serve(connection, function, device, own_copies=sanitized and device.type == "cuda")
    # Told to stop: end now, not after torch's teardown, which the parent would wait out. A sanitized child exits
    # normally: the sanitizer reports then.
    if not sanitized:
        end_process()


def _warm_triton(device) -> None:
    """Triton's one-off start (``triton_start``) before the first call, which would pay it; a failure is the
    target's first call's to report."""
    from .triton_start import start_triton

    with contextlib.suppress(Exception):  # the first call meets the same problem and reports it in full
        start_triton(device)


def _bound(function, definition, bindings: dict):
    """``function.for_definition(definition)``, once per definition (None, or a target without it: ``function``)."""
    if definition is None or not callable(getattr(function, "for_definition", None)):
        return function
    if definition.name not in bindings:
        bound = function.for_definition(definition)
        if not callable(bound):
            raise TypeError(f"for_definition({definition.name}) returned {type(bound).__name__}, not a callable")
        bindings[definition.name] = bound
    return bindings[definition.name]


def _on_host(value):
    """``value`` with each CUDA tensor copied to host memory (tuples, lists and dicts followed)."""
    from .arena import mapped

    return mapped(value, lambda tensor: tensor.cpu())


def _serve(connection, function, device, own_copies: bool) -> None:
    """Answer calls until told to stop. ``own_copies`` (a sanitized CUDA child): the call gets copies of its CUDA
    inputs in allocations of this process, whose bounds the sanitizer knows (an input shared from the parent lies in
    the parent's cached segment, where a read past it is not out of bounds), with its writes copied back."""
    import torch

    from .arena import resolved

    bindings: dict = {}
    buffers: dict = {}  # the parent's input buffers (``arena``), by device
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message[0] == "buffers":  # new or grown: each replaces the last of its device, which is let go
            buffers.update(message[1])
            continue
        if message[0] != "call":
            return
        _, definition, args, kwargs, ambient = message
        del message  # the inputs live in args and kwargs alone, released before the answer: the parent counts on it
        args, kwargs = resolved(args, buffers), resolved(kwargs, buffers)
        copies: dict = {}
        try:
            bound = _bound(function, definition, bindings)
            if args is None:  # only the binding was asked for
                connection.send(("result", None))
                continue
            _apply_ambient(torch, ambient)
            if own_copies:
                args, kwargs = copied(args, copies, "cuda"), copied(kwargs, copies, "cuda")
            value = bound(*args, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            copy_back(copies)
            # A sanitized child allocates without torch's cache, and CUDA IPC cannot share such memory ("invalid
            # device pointer"): its results go back through host memory.
            reply = ("result_on_host", _on_host(value)) if own_copies else ("result", value)
        except Exception as error:  # noqa: BLE001 - the implementation's error is the answer
            reply = ("raised", _describe(error))
        del args, kwargs, copies
        try:
            connection.send(reply)
        except Exception as error:  # noqa: BLE001 - a result torch cannot send (a view of an odd storage...)
            connection.send(("raised", _describe(TypeError(f"the implementation's result could not be sent to "
                                                            f"the checking process: {error!r}"))))
        reply = value = None
        if device.type == "cuda":  # the rule the workers follow: the huge-pool examples of a full GPU need it
            devices.release_cache_if_short(device)
