"""Work off the UI thread, and its progress and result back on the event loop: the app's one way (Qt-free).

Orange3's `ConcurrentMixin` / `TaskState` in asyncio's terms. `run_off_thread(fn)` runs `fn(state)` on a worker
thread and is awaited on the loop: the result comes back there, an exception is raised there, and cancelling the
awaiting task asks the function to stop (`state.cancelled`) and drops what it still reports. `state.report(...)`
called on the worker thread runs `on_progress(...)` on the loop, in order. `start_off_thread(job, done)` is the
same for a caller that is not a coroutine (a label that needs a count): `done(result, error)` runs on the loop.

`to_loop(fn)` is the one hop back, for a callback that a thread the app did not start calls (the model's worker
thread calls the step gate's "waiting", a training's progress, a load's progress): each call runs `fn(*args)` on
the loop.

`close_in_background(close)` is the one named exception: a Qt-free object's `close()` that may block (an engine
joins its worker, mid-generation or mid-load) on a daemon thread of its own, so that it never holds up the UI
thread nor, unlike a pool's threads (joined at exit), the interpreter's exit.

qasync's rule is why: a worker thread never touches a widget or a Signal's subscribers itself; only the loop
does. Every hop goes through `loop.call_soon_threadsafe` here, every worker through an executor here. The
documented exceptions (checked by tests/app/test_off_thread.py): `token_stream.FrameHop` batches a stream of
items to the frame rate, and `lifecycle` wakes the loop from a signal handler.

A worker thread also never drops the last reference to what the loop handed it (`ReleasedOnLoop`, and `to_loop`'s
hop for its `fn`): the function and its progress callback often hold widgets or controllers (bound methods), and
an object whose last reference goes on a worker thread is destroyed there. For a Qt object PySide6 then
disconnects it on that thread, holding Qt's lock while it waits for the GIL, and the UI thread, holding the GIL,
waits for that lock in its next `connect`: the window freezes for good (the cyclic-GC form of the same deadlock:
app/ui_thread_gc.py). That happens when the awaiting task was cancelled (a dialog closed) while its work still ran.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# For callers without a pool of their own. Not the loop's default executor: qasync's QThreads outlive a
# closed window, and a plain pool's threads end with the interpreter.
_shared: ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ThreadPoolExecutor(2, thread_name_prefix="logitlab-off-thread")
        return _shared


def _hop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Any thread: `fn(*args)` on `loop`; dropped (not raised into the caller's thread) once the loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the window is gone, nobody is watching
        log.debug("dropped a call to %r: the event loop is closed", fn)


def _let_go(box: list[Any]) -> None:
    """On the loop: drop what a worker thread handed over (the box's only references to it)."""
    box.clear()


class _LoopHop:
    """`to_loop`'s callable: each call runs `fn(*args)` on the loop; `fn` itself is let go of on the loop.

    A foreign thread (the model's worker) holds this object for as long as it likes and drops it there: the
    last reference to `fn` (a Signal's `emit`, a controller's method) then goes to the loop in a box, as
    `ReleasedOnLoop`'s do, rather than ending on that thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any]) -> None:
        self._loop = loop
        self._box: list[Any] = [fn]

    def __call__(self, *args: Any) -> None:
        _hop(self._loop, self._box[0], *args)

    def __del__(self) -> None:
        box, self._box = self._box, []
        try:
            _hop(self._loop, _let_go, box)  # with the loop closed, dropped: the box ends here
        except Exception:  # noqa: BLE001 - the interpreter is ending (this module's names already gone)
            pass


def to_loop(fn: Callable[..., Any], loop: asyncio.AbstractEventLoop | None = None) -> Callable[..., None]:
    """A callable for any thread: each call runs `fn(*args)` on `loop` (default: the running one), in call order.

    Once the loop is closed (the window is gone, nobody is watching) calls are dropped rather than raising
    into the thread that made them. Wherever the callable is dropped last, `fn` is let go of on the loop.
    """
    return _LoopHop(loop or asyncio.get_running_loop(), fn)


class ReleasedOnLoop:
    """`fn(*args)` for an executor, that lets go of `fn` and `args` on the loop rather than on the worker.

    An executor's work item keeps what it was given until after the call, and the worker thread drops it
    there; this object instead hands its references, in a box that is their only holder, to a call on `loop`
    that empties it, so they end on the loop's thread whatever the two threads' timing (handing the loop a
    reference while the worker kept one of its own let the worker's be the last about one time in five, when the
    loop ran first). `release()` (on the loop) lets go at once, for work that will never run (cancelled while
    queued). With the loop closed (the app is ending) they go on the worker.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
        self._loop = loop
        self._box: list[Any] = [fn, args]

    def __call__(self) -> Any:
        if not self._box:
            raise RuntimeError("this work was released before it ran")
        box, self._box = self._box, []
        try:
            return box[0](*box[1])
        except BaseException as e:
            # The error goes back through the futures, which the worker drops last: its frames' locals (the
            # work's `self`, often) must not ride along.
            traceback.clear_frames(e.__traceback__)
            raise
        finally:
            _hop(self._loop, _let_go, box)  # with the loop closed, dropped: the box ends with this frame, here

    def release(self) -> None:
        """On the loop: let go of the work without running it (it was cancelled before it started)."""
        self._box = []


class TaskState:
    """What a function running off the UI thread is handed: report progress, and see whether to stop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_progress: Callable[..., Any] | None) -> None:
        self._on_progress = on_progress
        self._cancel = threading.Event()
        self._loop = loop

    @property
    def cancelled(self) -> bool:
        """True once the awaiting task was cancelled: stop at the next good point (the result is dropped)."""
        return self._cancel.is_set()

    @property
    def cancel_event(self) -> threading.Event:
        """The same as `cancelled`, for code that takes a `threading.Event` (a decode loop, a score)."""
        return self._cancel

    def report(self, *args: Any) -> None:
        """Any thread: `on_progress(*args)` runs on the loop, unless the run was cancelled by then."""
        if self._on_progress is not None and not self._cancel.is_set():
            _hop(self._loop, self._deliver, *args)

    def _deliver(self, *args: Any) -> None:  # on the loop
        if self._on_progress is not None and not self._cancel.is_set():
            self._on_progress(*args)


def _submit(loop: asyncio.AbstractEventLoop, executor: Executor | None, fn: Callable[..., T],
            *args: Any) -> tuple["Future[T]", ReleasedOnLoop]:
    """`fn(*args)` on a worker of `executor` (default: the shared pool), let go of on `loop`. RuntimeError when the
    executor was shut down (the window is closing)."""
    work = ReleasedOnLoop(loop, fn, *args)
    return (executor or _shared_pool()).submit(work), work


async def run_off_thread(fn: Callable[[TaskState], T], *, on_progress: Callable[..., Any] | None = None,
                         executor: Executor | None = None) -> T:
    """`fn(state)` on a worker thread of `executor` (default: a small shared pool); its result on the loop.

    `on_progress(*args)` runs on the loop for every `state.report(*args)`. An exception of `fn` is raised here.
    Cancelling the awaiting task sets `state.cancelled` (a queued `fn` never starts) and returns at once; the
    function's late result and progress are dropped.
    """
    loop = asyncio.get_running_loop()
    state = TaskState(loop, on_progress)
    future, work = _submit(loop, executor, fn, state)  # `state` holds on_progress: a widget's method, often
    try:
        return await asyncio.wrap_future(future, loop=loop)
    except asyncio.CancelledError:
        state.cancel_event.set()
        if future.cancel():  # still queued: it never starts, and lets go of its references here
            work.release()
        raise


def start_off_thread(job: Callable[[], T], done: Callable[[T | None, BaseException | None], None], *,
                     executor: Executor | None = None) -> bool:
    """Start `job()` on a worker thread; `done(result, error)` runs on the loop when it ends (`run_off_thread` for
    a caller that is not a coroutine). False when nothing was started: no running event loop to come back to, or
    the executor was shut down (the window is closing)."""
    try:
        loop = asyncio.get_running_loop()
        future, _work = _submit(loop, executor, job)
    except RuntimeError:
        return False

    def finished(f: "asyncio.Future[T]") -> None:  # on the loop
        if f.cancelled():
            return
        error = f.exception()
        done(None if error is not None else f.result(), error)

    asyncio.wrap_future(future, loop=loop).add_done_callback(finished)
    return True


def close_in_background(close: Callable[[], object], name: str) -> None:
    """`close()` on a daemon thread of its own, named `name`: for a Qt-free object's close that may block (an
    engine's joins its worker, which may be mid-generation or mid-load).

    Not a pool: a pool's threads are joined when the interpreter exits, and a close stuck in a model must not hold
    the app's exit up. Not `ReleasedOnLoop`: the close often outlives the loop (the window closed), and what it
    holds (an engine) is Qt-free, so ending on this thread is safe. Never hand it a widget's method.
    """
    threading.Thread(target=close, name=name, daemon=True).start()
