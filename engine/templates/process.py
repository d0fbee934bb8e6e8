"""Chat templates rendered in a child process that is killed when a render runs past its time limit.

A chat template is the model's code. `engine.templates.render` stops most
runaway templates from inside (a trace function on the template's own lines,
size checks before big values are made), but two kinds escape any in-process
limit: one long C call that holds the GIL (`sum` of 100,000 lists with
`start=[]`) freezes every thread of the process, and a loop inside a library
filter (`striptags` of a 6 MB text) runs where the trace function never
looks. Only a separate process can be stopped from outside whatever it is
doing. So every render goes to one warm renderer process, started on first
use (or by `prestart`) and reused: an honest render costs a pipe round trip,
a fraction of a millisecond. A render that has not answered `GRACE_S` after
its limit gets the process killed; the next render starts a new one.

The child is a plain `python -c` (not multiprocessing's spawn, which runs
the parent's main script again in the child: a user's script without the
`__main__` guard would run twice) that imports only jinja2 and the renderer.
It bounds itself too, for when the parent is gone and cannot kill it: each
render sets an alarm that ends the process (SIGALRM's default action, which
needs no Python code to run) a little after the parent would have killed it,
and on Linux its address space may grow by at most `MEMORY_LIMIT_BYTES` over
its start.

Where no child process can be started (no `fork` allowed, a frozen app
without the `RENDERER_FLAG` dispatch), templates render in this process with
the in-process limits only, and that is logged once.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, BinaryIO, NoReturn

log = logging.getLogger(__name__)

GRACE_S = 1.0  # the child's own trace limit fires first; this much later the parent kills it
START_TIMEOUT_S = 60.0  # imports on a loaded two-core machine: starting is not the template's doing
MEMORY_LIMIT_BYTES = 1 << 30  # the address space a render may add to the child (Linux)
RENDERER_FLAG = "--logitlab-template-renderer"  # a frozen app's executable started as the renderer
_ORPHAN_SLACK_S = 2.0  # the child's own alarm goes off this long after the parent would have killed it
_HEADER = struct.Struct(">Q")  # every message: its length, then a pickle
_READY = ("ready", None)
_CLOSING = "the chat template's render was stopped: the engine is closing"
_EOF = ("eof", None)

# The child: the engine package without its __init__ (which imports the whole engine, numpy and all):
# only engine.errors, engine.templates.sandbox and this module are loaded, so it starts in a fraction of a second.
_CHILD_CODE = (
    "import sys, types\n"
    "sys.path[:0] = sys.argv[2:]\n"
    "pkg = types.ModuleType('engine'); pkg.__path__ = [sys.argv[1]]; sys.modules['engine'] = pkg\n"
    "from engine.templates.process import serve\n"
    "serve()\n"
)


class RendererUnavailable(Exception):
    """No renderer process could be started here; render in this process instead."""


class _Closed(Exception):
    """`close()` killed the renderer while it was starting."""


class Outcome:
    """What a render gave: its `text`, or an `error` message for `ChatTemplateError` (None with
    `overtime`: stopped at its time limit, the caller words it)."""

    __slots__ = ("text", "error", "overtime")

    def __init__(self, text: str | None = None, error: str | None = None, overtime: bool = False):
        self.text, self.error, self.overtime = text, error, overtime


class _Child:
    """One renderer process, its pipes, and the thread that reads its answers into a queue.

    The reader thread is what lets the parent wait with a time limit on any platform (Windows has
    no `select` on pipes); it ends when the process's output closes (exit or kill).
    """

    def __init__(self, command: list[str]):
        kwargs: dict[str, Any] = {}
        if os.name == "posix":
            # Its own session: Ctrl-C in the terminal is the parent's to handle, not the renderer's.
            kwargs["start_new_session"] = True
        elif os.name == "nt":
            kwargs["creationflags"] = getattr(subprocess, "CREATE_NO_WINDOW", 0)
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **kwargs
        )
        self.answers: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.max_answer_bytes = 1 << 20  # set before each render; an answer over it kills the child
        self.ready = False
        self._reader = threading.Thread(target=self._read, name="logitlab-template-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        try:
            while True:
                size = _read_exactly(stream, _HEADER.size)
                if size is None:
                    break
                (length,) = _HEADER.unpack(size)
                if length > self.max_answer_bytes:  # it may not make this process allocate more
                    self.answers.put(("too-large", length))
                    break
                raw = _read_exactly(stream, length)
                if raw is None:
                    break
                self.answers.put(pickle.loads(raw))
        except Exception:  # noqa: BLE001 - a broken pipe or a garbled answer: the child is done either way
            log.debug("reading the template renderer's answer failed", exc_info=True)
        self.answers.put(_EOF)

    def send(self, payload: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(_HEADER.pack(len(payload)) + payload)
        stdin.flush()

    def kill(self) -> int | None:
        """SIGKILL (a template inside a C call ignores anything gentler); the exit code."""
        try:
            if self.process.poll() is None:
                self.process.kill()
            code = self.process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            code = self.process.returncode
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._reader.join(1)
        return code


def _read_exactly(stream: IO[bytes], n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _command() -> list[str]:
    engine_dir = str(Path(__file__).resolve().parent)
    if getattr(sys, "frozen", False):  # a packaged app: its executable dispatches RENDERER_FLAG
        return [sys.executable, RENDERER_FLAG]
    # The parent's import path goes along: a script or a test may have put the engine there itself.
    paths = [p for p in sys.path if isinstance(p, str) and p]
    return [sys.executable, "-c", _CHILD_CODE, engine_dir, *paths]


class TemplateRenderer:
    """One renderer process, started lazily, reused, killed and replaced when a render overruns.

    Thread-safe: renders take turns (one process renders one template at a time); `close` may be
    called from any thread, also while a render waits (that render ends at once, with an error).
    """

    def __init__(self) -> None:
        self._render_lock = threading.Lock()  # one render at a time through the one pipe
        self._state_lock = threading.Lock()  # guards _child against close() from another thread
        self._child: _Child | None = None
        self._unavailable: str | None = None  # why no process can be started (then: in-process rendering)
        self._closing = False
        self._closes = 0  # how many times close() ran: a render asked for before a close ends with it

    def render(self, template: str, variables: Mapping[str, Any], time_limit_s: float, max_chars: int) -> Outcome:
        """Render in the child; one that has not answered `time_limit_s + GRACE_S` later is killed.

        Raises:
            RendererUnavailable: no child process can be started on this system.
        """
        try:
            payload = pickle.dumps((template, dict(variables), time_limit_s, max_chars), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - an unpicklable variable is the caller's mistake, said in words
            return Outcome(error=f"the chat's variables cannot be passed to the template renderer ({type(e).__name__}: {e})")
        asked_at = self._closes
        with self._render_lock:
            if self._closes != asked_at:  # closed while this render waited for the one before it
                return Outcome(error=_CLOSING)
            try:
                child = self._ready_child()
            except _Closed:
                return Outcome(error=_CLOSING)
            child.max_answer_bytes = 4 * max_chars + 4096  # UTF-8 of max_chars characters, and the pickle's frame
            try:
                child.send(payload)
            except (OSError, ValueError):  # it died between renders: start one afresh, once
                self._kill()
                child = self._ready_child()
                child.max_answer_bytes = 4 * max_chars + 4096
                child.send(payload)
            try:
                return self._answer(child, time_limit_s, max_chars)
            except BaseException:  # Ctrl-C while waiting: its answer would be read as the next render's
                self._kill()
                raise

    def prestart(self) -> None:
        """Start the renderer process now, so that the first render does not wait for its imports."""
        with self._render_lock:
            try:
                self._ready_child()
            except (RendererUnavailable, _Closed):
                pass

    def close(self) -> None:
        """Kill the renderer process (if any): every render asked for before this ends at once, with an error.

        A render asked for afterwards starts a new renderer process.
        """
        self._closes += 1
        self._closing = True
        self._kill()

    @property
    def pid(self) -> int | None:
        """The renderer process's id while one runs (for tests)."""
        child = self._child
        return child.process.pid if child is not None and child.process.poll() is None else None

    def _ready_child(self) -> _Child:
        if self._unavailable is not None:
            raise RendererUnavailable(self._unavailable)
        child = self._child
        if child is None:
            self._closing = False
            try:
                child = _Child(_command())
            except (OSError, ValueError) as e:
                self._give_up(f"{type(e).__name__}: {e}")
            with self._state_lock:
                self._child = child
        if not child.ready:
            # It says so once its imports are done: a render's clock starts after that.
            try:
                kind, detail = child.answers.get(timeout=START_TIMEOUT_S)
            except queue.Empty:
                kind, detail = "timeout", f"it did not start within {START_TIMEOUT_S:g} s"
            if (kind, detail) != _READY:
                self._kill()
                if self._closing:  # killed by close() while it started: nothing is wrong with this system
                    raise _Closed()
                self._give_up(detail if isinstance(detail, str) else f"it stopped while starting (exit status {child.process.returncode})")
            child.ready = True
        return child

    def _give_up(self, why: str) -> NoReturn:
        self._unavailable = why
        log.warning("chat templates render in this process: no renderer process could be started (%s)", why)
        raise RendererUnavailable(why)

    def _answer(self, child: _Child, time_limit_s: float, max_chars: int) -> Outcome:
        try:
            kind, value = child.answers.get(timeout=time_limit_s + GRACE_S)
        except queue.Empty:
            self._kill()
            return Outcome(overtime=True)
        if kind == "ok" and isinstance(value, str) and len(value) <= max_chars:
            return Outcome(text=value)
        if kind in ("error", "overtime"):
            return Outcome(error=str(value), overtime=kind == "overtime")
        if kind == "too-large" or kind == "ok":
            self._kill()
            return Outcome(error=f"the model's chat template gave more than {max_chars:,} characters")
        # The process ended mid-render: killed by close(), its own CPU limit, memory, or a crash.
        code = self._kill()
        if self._closing:
            return Outcome(error=_CLOSING)
        if code == -getattr(signal, "SIGALRM", 14):
            return Outcome(overtime=True)  # its own alarm: ran out of time
        return Outcome(error=f"the chat template's renderer stopped while rendering it ({_exit_words(code)}; "
                             "it may have needed too much memory)")

    def _kill(self) -> int | None:
        with self._state_lock:
            child, self._child = self._child, None
        return child.kill() if child is not None else None


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# -- the child ------------------------------------------------------------------------------


def serve(stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """The renderer process: render each request with the in-process limits and answer, until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it decides when this process ends
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # `_limit_time`: the alarm ends the process
    if stdout is None:
        # Our answers own fd 1: anything else that prints (a library warning) goes to stderr instead.
        stdout = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
    # The descriptors, not sys.stdin: a windowed (frozen) app may have no sys.stdin, yet has the pipe.
    stdin = stdin or os.fdopen(os.dup(0), "rb")
    try:
        from engine.templates.sandbox import render_in_this_process

        _limit_memory()
    except BaseException as e:  # noqa: BLE001 - told to the parent, which renders in-process instead
        _write(stdout, ("failed", f"{type(e).__name__}: {e}"))
        return
    _write(stdout, _READY)
    while True:
        header = _read_exactly(stdin, _HEADER.size)
        raw = header and _read_exactly(stdin, _HEADER.unpack(header)[0])
        if raw is None:  # the parent is gone or closed the pipe
            return
        template, variables, time_limit_s, max_chars = pickle.loads(raw)
        _limit_time(time_limit_s)
        answer = _render_one(render_in_this_process, template, variables, time_limit_s, max_chars)
        _limit_time(None)
        _write(stdout, answer)


def _write(stream: BinaryIO, message: tuple[str, Any]) -> None:
    raw = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(raw)) + raw)
    stream.flush()


def _render_one(
    render: Callable[..., str], template: str, variables: dict, time_limit_s: float, max_chars: int
) -> tuple[str, str]:
    from engine.templates.sandbox import ChatTemplateError, RanOutOfTime

    try:
        return ("ok", render(template, variables, time_limit_s=time_limit_s, max_chars=max_chars))
    except RanOutOfTime as e:
        return ("overtime", str(e))
    except ChatTemplateError as e:
        return ("error", str(e))
    except BaseException as e:  # noqa: BLE001 - whatever it was, the parent gets words, not a dead pipe
        return ("error", f"the model's chat template failed ({type(e).__name__}: {e})")


def _limit_time(time_limit_s: float | None) -> None:
    """The kernel ends this process (SIGALRM, whose default is to terminate) this long after a render starts,
    even with no parent left to kill it and a C call holding the GIL; None cancels the alarm."""
    if hasattr(signal, "setitimer"):  # not on Windows
        seconds = 0.0 if time_limit_s is None else time_limit_s + GRACE_S + _ORPHAN_SLACK_S
        signal.setitimer(signal.ITIMER_REAL, seconds)


def _limit_memory() -> None:
    """No core file when killed, and (Linux) at most MEMORY_LIMIT_BYTES more address space than at start."""
    try:
        import resource
    except ImportError:
        return
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ValueError, OSError):
        pass
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return  # not Linux: RLIMIT_AS is not enforced elsewhere; the size checks are the bound
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = size + MEMORY_LIMIT_BYTES
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (ValueError, OSError):
        pass


# -- the one renderer of this process -------------------------------------------------------

_renderer = TemplateRenderer()


def renderer() -> TemplateRenderer:
    """This process's renderer (one: renders are short, and a second process would be memory for nothing)."""
    return _renderer


def prestart() -> None:
    """Start the renderer process in the background now (when a model loads), so a first send need not wait."""
    threading.Thread(target=_renderer.prestart, name="logitlab-template-renderer-start", daemon=True).start()


def shutdown() -> None:
    """Kill the renderer process; a later render starts a new one."""
    _renderer.close()


atexit.register(shutdown)
# Also before the interpreter joins its thread pools' threads (threading's own exit hooks run first): a
# render under way on one of them would otherwise hold the exit until its time limit.
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(shutdown)
