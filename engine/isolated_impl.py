"""The parent side of isolation (see ``isolation``): ``IsolatedImpl``, the callable the properties call, and the
``Child`` process behind it; what the parent accepts from the child and how inputs reach it."""

from __future__ import annotations

import contextlib
import functools
import io
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import re
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.multiprocessing

from . import child_start, examples
from .arena import Arenas, mapped
from .child_start import Launch, Started
from .containment import is_sticky_cuda_error
from .isolation import (
    BASE_TIMEOUT_S,
    CALL_TIMEOUT_ENV,
    PER_TOKEN_S,
    SANITIZE_EVERY,
    ImplementationCrashed,
    ImplementationFailed,
    ImplementationHung,
    ResultChangedAfterReturn,
    SanitizerError,
    call_deadline,
)
from .isolation_child import copied, copy_back
from .target import (
    ImplSpecError,
    Target,
    load_target,
    make_target,
    solution_and_definition,
)

if TYPE_CHECKING:
    from gqa_decode_fuzz.reference.definitions import Definition

START_TIMEOUT_S = 120.0  # spawn, import torch and the target (and a sanitizer's start)
SANITIZED_SLOWDOWN = 10.0  # a sanitized child's calls may take this many times the deadline: instrumented kernels
# and a Triton compile under compute-sanitizer run far slower than plain ones
LOG_TAIL_LINES = 30
STANDBY_LAPSE = 100  # calls without a death after which a standby child is stopped (the crash is behind the run)

__all__ = ["Child", "IsolatedImpl", "Launch", "load_isolated_target"]


# ---- what the parent accepts from the child -----------------------------------------------------

_ALLOWED = {
    ("torch.multiprocessing.reductions", name) for name in (
        "rebuild_tensor", "rebuild_cuda_tensor", "rebuild_storage_fd", "rebuild_storage_filename",
        "rebuild_storage_empty", "rebuild_typed_storage", "rebuild_typed_storage_child", "rebuild_event")
} | {("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"), ("torch", "Tensor"),
     ("torch", "Size"), ("torch", "device"), ("multiprocessing.resource_sharer", "DupFd"),
     ("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")}


class _Unpickler(pickle.Unpickler):
    """Unpickles torch's shared tensors and plain data only: no other class or function is found."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"the implementation's process sent {module}.{name}, which the checking "
                                     "process does not accept (only tensors and plain data)")


def _loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


class _SharePickler(multiprocessing.reduction.ForkingPickler):
    """torch's pickler for the pipe, which also records the reference counter of each CUDA storage it shares
    (``shares``): the parent's memory stays allocated until the child has released each one."""

    def __init__(self, file: io.BytesIO, shares: list) -> None:
        super().__init__(file)
        self.shares = shares

    def reducer_override(self, obj: Any) -> Any:
        if not (isinstance(obj, torch.Tensor) and obj.is_cuda):
            return NotImplemented
        rebuild, args = torch.multiprocessing.reductions.reduce_tensor(obj)
        self.shares.append((args[11], args[12], obj.device))  # ref_counter_handle, ref_counter_offset
        return rebuild, args


def _dumps(message: Any, shares: list) -> bytes:
    """``message`` pickled as ``Connection.send`` would, each CUDA share recorded in ``shares``."""
    buffer = io.BytesIO()
    _SharePickler(buffer, shares).dump(message)
    return buffer.getvalue()


def _release_shares(shares: list) -> None:
    """Release, for a child that died holding them, the CUDA inputs it was sent. Torch keeps a shared block
    allocated until every process it was sent to has decremented its counter, and a dead child never does: each
    crashing example would leave its inputs behind (docs/findings.md). Each share has a counter of its own, and a
    block whose counter is at or below zero is freed, so releasing one the child had already released frees nothing
    early."""
    if not shares:
        return
    for handle, offset, device in shares:
        with contextlib.suppress(RuntimeError):
            torch.UntypedStorage._release_ipc_counter(handle, offset, device=device)
    shares.clear()
    if torch.cuda.is_initialized():
        torch.cuda.ipc_collect()


def _owned(value: Any, received: list) -> Any:
    """``value`` with each tensor copied into the parent's own memory (the original kept in ``received``)."""

    def own(tensor: torch.Tensor) -> torch.Tensor:
        received.append((tensor, copy := tensor.clone()))
        return copy

    return mapped(value, own)


def _call_device(args: tuple | None, kwargs: dict | None) -> torch.device:
    """The device of a call's first tensor argument (the CPU without one)."""
    for value in (*(args or ()), *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _to_device(value: Any, device: torch.device) -> Any:
    """``value`` with each tensor moved to ``device`` (tuples, lists and dicts followed)."""
    return mapped(value, lambda tensor: tensor.to(device))


_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaN equals the same NaN)."""
    as_int = _SAME_SIZE_INTS.get(a.element_size())
    if as_int is None or a.dtype != b.dtype:
        return torch.equal(a, b)
    return torch.equal(a.view(as_int), b.view(as_int))


# ---- the inputs' way in -----------------------------------------------------------------------


def _ambient() -> dict[str, Any]:
    return {"fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled()}


def _reraised(description: dict) -> BaseException:
    """The implementation's exception as the nearest built-in ``Exception`` class, naming the original."""
    import builtins

    for name in description.get("mro", ()):
        cls = getattr(builtins, str(name), None)
        if isinstance(cls, type) and issubclass(cls, Exception) and cls is not Exception:
            break
    else:
        cls = Exception
    original = description.get("type", "?")
    message = str(description.get("message", ""))
    said = message if original.startswith("builtins.") else f"{original}: {message}"
    try:
        error = cls(said)
    except Exception:  # noqa: BLE001 - a built-in whose constructor wants more (UnicodeDecodeError)
        error = Exception(said)
    error.add_note(f"raised in the implementation's process:\n{description.get('traceback', '')}")
    return error


_BACKTRACE_FRAME = re.compile(r"\s*frame #\d+: ")


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no output)"
    # A C++ abort's backtrace ("frame #12: ...") would push its message ("what(): CUDA error ...") out of the tail.
    tail = [line for line in text.splitlines() if line.strip() and not _BACKTRACE_FRAME.match(line)][-lines:]
    return "\n".join(tail) or "(no output)"


def _exit_words(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


class Child:
    """One child process serving calls of the target; ``call`` raises ``ImplementationFailed`` when it dies,
    hangs or (sanitized) logs an error. A dead child stays dead: the ``IsolatedImpl`` starts another."""

    def __init__(self, launch: Launch, started: Started | None = None) -> None:
        """Start the child for ``launch``, or take one ``child_start.start`` began for it, and wait till it is
        ready (its declarations) or has refused (``ChildRefused``)."""
        if started is not None and started.launch != launch:
            raise ValueError(f"a child started for {started.launch} cannot serve {launch}")
        self.started = started if started is not None else child_start.start(launch)
        self.launch, self.process, self.connection = launch, self.started.process, self.started.connection
        self.log, self.sanitizer_log = self.started.log, self.started.sanitizer_log
        self.unreleased: list = []  # the CUDA shares of the call in flight (``_release_shares``)
        # The input buffers (``arena``; not for a sanitized child, which copies its inputs into allocations of its
        # own) and their CUDA shares, which the child holds for its life.
        self.arenas, self.held = (Arenas() if launch.sanitize is None else None), []
        self.sanitizer_seen = 0  # bytes of the sanitizer's log already read
        kind, said = self._receive(START_TIMEOUT_S + float(os.environ.get(CALL_TIMEOUT_ENV) or BASE_TIMEOUT_S),
                                   "starting")
        if kind == "refused":
            self.stop()
            raise ChildRefused(_refusal(said))
        if kind != "ready" or not isinstance(said, dict):
            self.stop()
            raise ChildRefused(f"the implementation's process answered {kind!r} to its start")
        self.declarations = said

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.is_alive()

    def call(self, definition: Definition | None, args: tuple | None, kwargs: dict | None, received: list) -> Any:
        """Call the target (bound to ``definition`` where it declares ``for_definition``; None: as loaded) in the
        child; its result, in tensors the parent owns (originals in ``received``). ``args=None`` only binds."""
        copies: dict = {}
        packed = self.arenas.pack(args, kwargs) if self.arenas is not None else None
        if packed is None:  # the per-call way: CUDA tensors shared as they are, CPU ones copied to shared memory
            packed = copied(args, copies, "cpu"), copied(kwargs, copies, "cpu")
        try:
            if self.arenas is not None and (buffers := self.arenas.unsent()):
                self.connection.send_bytes(_dumps(("buffers", buffers), self.held))
            self.connection.send_bytes(_dumps(("call", definition, *packed, _ambient()), self.unreleased))
        except (BrokenPipeError, ConnectionError, EOFError) as error:
            raise self._died("before the call reached it") from error
        deadline = call_deadline(args or (), kwargs or {}) * (SANITIZED_SLOWDOWN if self.sanitizer_log else 1.0)
        kind, value = self._receive(deadline, "the call")
        self.unreleased.clear()  # the child lets go of the call's inputs before it answers
        copy_back(copies)
        if self.arenas is not None:
            self.arenas.copy_back()
        self._check_sanitizer(answered=kind in ("result", "result_on_host"))
        if kind == "result":
            return _owned(value, received)
        if kind == "result_on_host":  # a sanitized child's: back to the device of the call
            return _owned(_to_device(value, _call_device(args, kwargs)), received)
        if kind == "raised" and isinstance(value, dict):
            if _is_sticky(value):
                self.stop()
                raise ImplementationCrashed(f"the implementation's CUDA context was lost (a sticky error: every later "
                                            f"call in that process would fail): {value.get('message')}\n"
                                            "its process was replaced")
            raise _reraised(value)
        raise ImplementationFailed(f"the implementation's process answered {kind!r}")

    def _receive(self, timeout: float, what: str) -> tuple[str, Any]:
        ready = multiprocessing.connection.wait([self.connection, self.process.sentinel], timeout)
        if self.connection in ready:
            try:
                message = _loads(self.connection.recv_bytes())
            except (EOFError, OSError) as error:
                raise self._died(f"during {what}") from error
            except pickle.UnpicklingError as error:
                self.stop()
                raise ImplementationFailed(str(error)) from None
            if isinstance(message, tuple) and len(message) == 2 and isinstance(message[0], str):
                return message
            self.stop()
            raise ImplementationFailed("the implementation's process sent something other than an answer")
        if ready:
            raise self._died(f"during {what}")
        tail = _log_tail(self.log)
        self.stop()
        raise ImplementationHung(f"the implementation did not answer within {timeout:.1f} s ({what}; deadline: "
                                 f"{CALL_TIMEOUT_ENV} or {BASE_TIMEOUT_S:.0f} s, plus {PER_TOKEN_S * 1e3:.0f} ms "
                                 f"per KV token); its process was killed\nits last output:\n{tail}")

    def _died(self, when: str) -> ImplementationCrashed | SanitizerError:
        """The child's death as the call's failure: a ``SanitizerError`` where the sanitizer logged an error first
        (memcheck stops the kernel it caught, and torch aborts on the launch failure)."""
        self.process.join(5)
        code = self.process.exitcode
        tail, report = _log_tail(self.log), self._sanitizer_report()[0] if self.sanitizer_log else ""
        self.stop()  # removes the log
        said = (f"the implementation's process died {when} ({_exit_words(code)}); its process will be replaced\n"
                f"its last output:\n{tail}" + (f"\ncompute-sanitizer:\n{report}" if report else ""))
        if any(_is_sanitizer_error(line) for line in report.splitlines()):
            return SanitizerError(f"compute-sanitizer --tool {self.launch.sanitize} reported an error, then " + said)
        return ImplementationCrashed(said)

    def _sanitizer_report(self, since: int = 0) -> tuple[str, int]:
        """The sanitizer's lines from byte ``since`` of its log on (a long shrink's log grows by every error), and
        the byte it read to."""
        try:
            with open(self.sanitizer_log, "rb") as log:
                log.seek(since)
                data = log.read()
        except OSError:
            return "", since
        text = data.decode("utf-8", errors="replace")
        return "\n".join(line for line in text.splitlines() if line.startswith("=========")), since + len(data)

    def _check_sanitizer(self, answered: bool) -> None:
        """A sanitized child: any error line logged since the last call fails this one. A child that still
        answered with a result is kept (the sanitizer ended only the faulting kernel; a fresh sanitized child
        costs seconds, and a shrink fails many calls); one whose call raised is replaced."""
        if self.sanitizer_log is None:
            return
        report, self.sanitizer_seen = self._sanitizer_report(since=self.sanitizer_seen)
        new = report.splitlines()
        if any(_is_sanitizer_error(line) for line in new):
            if not answered:
                self.stop()
            raise SanitizerError(f"compute-sanitizer --tool {self.launch.sanitize} reported during the call:\n"
                                 + "\n".join(new[:200]))

    def stop(self) -> None:
        """End the process (politely when idle, killed otherwise), release what it held and remove its folder."""
        self.started.stop()
        if not self.process.is_alive():  # a child ended by ``end_process`` or a signal released nothing itself
            self.arenas = None  # the buffers' memory is freed once their counters are released too
            _release_shares(self.unreleased + self.held)
            self.unreleased, self.held = [], []


def _refusal(description: Any) -> str:
    """The child's reason for not loading the target: ``ImplSpecError``'s own words, or the error and where."""
    if not isinstance(description, dict):
        return str(description)
    message = str(description.get("message", ""))
    if str(description.get("type", "")).endswith(".ImplSpecError"):
        return message
    return (f"importing or binding it raised {description.get('type')}: {message}\n"
            f"{str(description.get('traceback', ''))[-3000:]}")


class ChildRefused(Exception):  # noqa: N818
    """The child could not load the target (bad spec, import error, bad declaration); the message says why."""


_BENIGN = ("========= COMPUTE-SANITIZER", "========= ERROR SUMMARY: 0 errors")


def _is_sanitizer_error(line: str) -> bool:
    return line.startswith("=========") and line.strip() != "=========" and not line.startswith(_BENIGN) \
        and not line.startswith("=========     ")  # an error's indented detail lines; its first line counts


def _is_sticky(description: dict) -> bool:
    if "RuntimeError" not in description.get("mro", ()):
        return False
    return is_sticky_cuda_error(RuntimeError(str(description.get("message", ""))))


class SanitizerShare:
    """Which examples run in the sanitized child: a value drawn in the example (it replays and shrinks with it),
    one in ``every``; after a sanitizer error, every example of that test item, so shrinking stays sanitized.
    An explicit ``@example`` (nothing to draw from) is sanitized when ``every`` is 1 or the item is promoted."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._example: object = None
        self._sanitized = False
        self.promoted = False
        self.counts = {"sanitized": 0, "plain": 0}

    def begin_item(self) -> None:
        """A new test item: the promotion of the last one ends."""
        self.promoted = False

    def current(self) -> bool:
        """Whether the running example's calls go to the sanitized child."""
        from hypothesis import strategies as st

        example = examples.running_example()
        if example is None:  # an explicit example, with nothing to draw from: sanitized only with every 1
            return self.promoted or self.every == 1
        if example is not self._example:
            drawn = examples.draw_in(example, st.integers(0, self.every - 1), label="sanitized")
            self._example, self._sanitized = example, self.promoted or drawn == self.every - 1
            self.counts["sanitized" if self._sanitized else "plain"] += 1
        return self._sanitized


class IsolatedImpl:
    """The callable the properties call in place of the implementation: each call runs in a child (``Child``),
    started at construction (for the target's declarations; ``started``: the plain child, already spawned) and
    again after one dies.

    A target whose child has died once is likely to kill the next ones too (shrinking a crash replays it again and
    again), and each fresh child spends about a second importing torch and the target. So from a first death on,
    a standby child is spawned beside each replacement, and the next replacement takes it, already started. After
    ``STANDBY_LAPSE`` calls without a death the crash is behind the run, and the standby (a process, on a GPU a
    CUDA context) is stopped until the next death."""

    def __init__(self, launch: Launch, sanitize_every: int = SANITIZE_EVERY, started: Started | None = None) -> None:
        self.launch = launch
        self.__name__ = self.__qualname__ = f"isolated {launch.spec}"
        self._children: dict[bool, Child | None] = {False: Child(replace(launch, sanitize=None), started), True: None}
        self._standby: dict[bool, Started] = {}  # by sanitized: a child spawned for the next replacement
        self.declarations = self._children[False].declarations
        if self.declarations.get("serves_several"):  # what ``Target.serves_several`` looks for
            self.for_definition = self._for_definition
        self.share = SanitizerShare(sanitize_every) if launch.sanitize else None
        self._received: list[tuple[torch.Tensor, torch.Tensor]] = []
        # The last checked results, kept: while they live, their segments of the child's memory stay mapped here,
        # and the next results, which the child's allocator mostly puts in the same segments, need no new mapping.
        self._kept: list[torch.Tensor] = []
        self.calls = self.restarts = 0
        self._calls_since_death = 0

    def _child(self, sanitized: bool) -> Child:
        child = self._children[sanitized]
        if child is None or not child.alive:
            launch = self.launch if sanitized else replace(self.launch, sanitize=None)
            started = None
            if child is not None:
                self.restarts += 1
                self._calls_since_death = 0
                self._kept = []  # the dead child's memory
                started = self._standby.pop(sanitized, None) or child_start.start(launch)
                self._standby[sanitized] = child_start.start(launch)  # importing while its predecessor serves
            child = Child(launch, started)
            self._children[sanitized] = child
        return child

    def __call__(self, *args, **kwargs):
        return self.call(None, args, kwargs)

    def _for_definition(self, definition: Definition | None) -> Callable:
        """The target's ``for_definition(definition)``, run in the child now (a refusal raises here, as the nearest
        built-in class of what it raised); calls of what it returns carry the definition to the child."""
        try:
            self.call(definition, None, None)
        except ImplementationFailed as error:  # ``Target.serving`` words a ValueError as a refusal
            raise ValueError(str(error)) from None
        return functools.partial(self.call_bound, definition)

    def call_bound(self, definition: Definition | None, *args, **kwargs):
        """A call of the target bound to ``definition``."""
        return self.call(definition, args, kwargs)

    def call(self, definition: Definition | None, args: tuple | None, kwargs: dict | None):
        """One call in a child (the sanitized one for the example's share); ``args=None`` only binds."""
        self.check_returned()
        sanitized = self.share is not None and args is not None and self.share.current()
        self.calls += args is not None
        try:
            results = self._child(sanitized).call(definition, args, kwargs, self._received)
            self._calls_since_death += 1
            if self._standby and self._calls_since_death >= STANDBY_LAPSE:
                self._stop_standbys()
            return results
        except ImplementationFailed as error:
            failure = error
            if isinstance(error, SanitizerError) and self.share is not None:
                self.share.promoted = True
        _raise_plainly(failure)

    def check_returned(self) -> None:
        """Every tensor the child returned since the last check still holds what the parent copied on receipt."""
        received, self._received = self._received, []
        if received:
            self._kept = [shared for shared, _ in received]
        for shared, copy in received:
            if not _bits_equal(shared, copy):
                _raise_plainly(ResultChangedAfterReturn(
                    "the implementation wrote into a result after it had returned it (a thread or a stream left "
                    f"running after the call): a {tuple(shared.shape)} {shared.dtype} result changed after the "
                    "check had copied it"))

    def wrapping(self, example: Callable) -> Callable:
        """``example`` (one Hypothesis example) followed by ``check_returned`` when it passed."""

        def checked(*args, **kwargs):
            result = example(*args, **kwargs)
            self.check_returned()
            return result

        return checked

    def close(self) -> None:
        """Stop the children, standbys included."""
        for child in self._children.values():
            if child is not None:
                child.stop()
        self._stop_standbys()
        self._received, self._kept = [], []

    def _stop_standbys(self) -> None:
        for started in self._standby.values():
            started.stop()
        self._standby.clear()


def _raise_plainly(failure: ImplementationFailed) -> NoReturn:
    """Raise ``failure`` from this one line, without the chained errors that led to it. Hypothesis tells failures
    apart by their type and where they were raised, chained errors included (its "interesting origin"): a child's
    death seen while sending the call and the same death seen while waiting for the answer are one failure, which
    it would otherwise report as flaky (seen with tests/impls/process_faults.py:segfault). Call it outside any
    ``except`` block, where Python would chain the error being handled."""
    failure.__cause__ = failure.__context__ = None
    raise failure.with_traceback(None)


def load_isolated_target(launch: Launch, sanitize_every: int = SANITIZE_EVERY,
                         started: Started | None = None) -> Target:
    """The ``Target`` of ``launch.spec`` loaded in a child (``started``: one already spawned for it): its
    declarations as the child reports them, checked here, and an ``IsolatedImpl`` as its function. A target the
    child cannot load raises ``ImplSpecError``."""
    try:
        function = IsolatedImpl(launch, sanitize_every, started)
    except ChildRefused as error:
        said = str(error)
        raise ImplSpecError(said if said.startswith("--impl=") else f"--impl={launch.spec!r}: {said}") from None
    try:
        return make_target(launch.spec, function, function.declarations)
    except ImplSpecError:
        function.close()
        raise


def load_target_for(spec: str, root: Path, device_type: str, definition: Definition | None = None, *, isolated: bool,
                    sanitize: str | None = None, sanitize_every: int = SANITIZE_EVERY,
                    started: Started | None = None, inside_mps: bool = False) -> Target:
    """The ``Target`` of ``spec`` as the suite and the replay load it: imported here, or (``isolated``) in a child
    process (``load_isolated_target``; ``started``: its plain child, already spawned; ``inside_mps``: see
    ``Launch``), a Solution file read here and its code run in the child only. ``definition``: the one asked for,
    if any (a Solution file for another is refused)."""
    if not isolated:
        return load_target(spec, root=root, definition=definition)
    solution = None
    if spec.endswith(".json"):
        try:
            solution, definition = solution_and_definition(spec, root, definition)
        except BaseException:
            if started is not None:
                started.stop()
            raise
    launch = Launch(spec, root, device_type, sanitize=sanitize, inside_mps=inside_mps)
    target = load_isolated_target(launch, sanitize_every, started)
    return replace(target, solution=solution, definition=definition) if solution else target
