"""Three tests run by tests/test_prompt_exit.py, in a pytest of its own (not collected here).

Each worker appends to the file ``PROMPT_EXIT_LOG`` names a line "WHAT WORKER" when its exit handlers run ("exit
handlers"), when this module's object is finalised ("finalised": the interpreter's own teardown), whether the
garbage collector had frozen objects during the first test ("frozen True"), and, with ``PROMPT_EXIT_LATE_THREAD=1``,
when a thread that is not a daemon, started by the last test, ends ("thread done"). With
``PROMPT_EXIT_UNRAISABLE=1`` the second test leaves a reference cycle whose ``__del__`` raises, and collects it;
with ``PROMPT_EXIT_FAIL=1`` it fails.
"""

import atexit
import gc
import os
import threading
import time

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_FD = os.open(os.environ["PROMPT_EXIT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def _log(what: str, _write=os.write, _fd=_FD, _worker=WORKER) -> None:  # bound now: usable during teardown
    _write(_fd, f"{what} {_worker}\n".encode())


atexit.register(_log, "exit handlers")


class _Finalised:
    def __del__(self, _log=_log) -> None:
        _log("finalised")


_FINALISED = _Finalised()


class _RaisesWhenCollected:
    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        raise RuntimeError("the cycle's __del__ raised")


def test_one():
    _log(f"frozen {gc.get_freeze_count() > 0}")


def test_two():
    assert os.environ.get("PROMPT_EXIT_FAIL") != "1", "failing as asked"
    if os.environ.get("PROMPT_EXIT_UNRAISABLE") == "1":
        _RaisesWhenCollected()
        gc.collect()


def test_a_thread_still_runs_when_the_session_ends():
    if os.environ.get("PROMPT_EXIT_LATE_THREAD") != "1":
        return

    def late() -> None:
        time.sleep(3.0)  # still running when the session ends
        _log("thread done")

    threading.Thread(target=late, name="late", daemon=False).start()
