"""Engine threads that work in the background, all stopped before the interpreter exits.

A daemon thread that is inside native code (a torch kernel, a compile) when
the interpreter finalizes is ended by the runtime in a way C++ cannot unwind:
the process aborts with `terminate called without an active exception`
(issue 31: `logitlab-cli generate` on CUDA, the compile thread still
building). A daemon thread that is merely left running is no better. So the
engine's long-lived threads (the model worker, the compile thread) are
`BackgroundThread`s: `stop()` raises `BackgroundStopped` inside the thread at
its next Python line (torch.compile, a transformers forward and a model load
are mostly Python) and waits for it; at interpreter exit every one still
running is stopped (atexit runs while threads still run normally, before the
interpreter starts tearing itself down).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import threading
import time
import weakref
from collections.abc import Callable

log = logging.getLogger(__name__)

EXIT_WAIT_S = 5.0  # at interpreter exit, how long all background threads together get to end


class BackgroundStopped(BaseException):
    """Raised inside a `BackgroundThread` to end it (a BaseException, so no `except Exception` keeps it going)."""


_live: "weakref.WeakSet[BackgroundThread]" = weakref.WeakSet()


class BackgroundThread(threading.Thread):
    """A daemon thread running `target()` that `stop()` can end between two Python lines."""

    def __init__(self, target: Callable[[], None], name: str):
        super().__init__(name=name, daemon=True)
        self._work = target
        self._lock = threading.Lock()
        self._finished = False  # the target has returned: raising into this thread would hit someone else's code
        self._raised = False
        _live.add(self)

    def run(self) -> None:
        try:
            try:
                self._work()
            finally:
                with self._lock:
                    self._finished = True
        except BackgroundStopped:
            log.debug("%s stopped", self.name)

    @property
    def stop_requested(self) -> bool:
        """`stop()` raised into the thread: what its target catches from here on may be that stop in disguise
        (a library that wraps every exception of its callee in its own type)."""
        return self._raised

    def stop(self, timeout: float | None = EXIT_WAIT_S) -> bool:
        """Raise `BackgroundStopped` in the thread (once) and wait up to `timeout` s; True when it has ended.

        A thread inside one long native call ends when that call returns.
        """
        if self is threading.current_thread():
            return False
        with self._lock:
            if not self._finished and not self._raised and self.ident is not None and self.is_alive():
                self._raised = _raise_in(self.ident, BackgroundStopped)
        self.join(timeout)
        return not self.is_alive()


def _raise_in(thread_id: int, exc: type[BaseException]) -> bool:
    """CPython's `PyThreadState_SetAsyncExc`: the only way to end a thread that does not look at a flag."""
    pythonapi = getattr(ctypes, "pythonapi", None)
    if pythonapi is None:  # not CPython
        return False
    return pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc)) == 1


def stop_all(timeout: float = EXIT_WAIT_S) -> bool:
    """Stop every background thread of this process, waiting at most `timeout` s in all; True when all ended."""
    deadline = time.monotonic() + timeout
    threads = [t for t in list(_live) if t.is_alive()]
    for thread in threads:
        thread.stop(timeout=0)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        log.warning("background threads still running at exit: %s", ", ".join(alive))
    return not alive


atexit.register(stop_all)
