"""Model ▸ Serve…: the loaded model (or another server, proxied) as an OpenAI-compatible server beside the window.

Qt-free, like the chat's controller: the Serve dialog and the status bar subscribe to `changed` and draw
`state`. The server (engine.serve.start_server) runs on its own thread with its own event loop, so the
window's loop never waits on a client; starting (it binds and waits for the server to be up) and stopping
(it joins the server's thread) run off the UI thread. Every request served becomes a conversation
(app/controllers/served_conversations.py). Loading another model stops serving (the server holds the old model);
closing the window stops it and writes what was served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from app.controllers.engine_host import EngineHost, describe_error
from app.state.answer_recipe import model_reasoning_format
from app.controllers.off_thread import run_off_thread
from app.controllers.served_conversations import ServedConversations
from app.state.conversation import Conversation
from app.state.conversation_list import Library
from app.state.observable import Signal
from engine import TOP_LOGPROBS_MAX

log = logging.getLogger(__name__)

SETTINGS_KEY = "serve_settings"  # the dialog's last address and upstream (never the API key)
DEFAULT_PORT = 8080
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_URL = re.compile(r"^https?://[^\s/]+", re.IGNORECASE)


class ServeError(ValueError):
    """Serving cannot start as asked; the message says why in words a user can act on."""


def is_loopback(host: str) -> bool:
    return host.strip().lower() in LOOPBACK or host.strip().startswith("127.")


@dataclass(frozen=True)
class ServeSettings:
    """What the Serve dialog asks for: where to listen, the key clients must send, an upstream to forward to."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str = ""
    upstream: str = ""
    # Proxy mode: the alternatives per token asked of the upstream for the record (`serve --upstream-top-n`);
    # None asks only what each client asks, since behind llama.cpp's server the top 20 cost several times the
    # plain answer (bench/proxy_top_n.py).
    upstream_top_n: int | None = None

    def problem(self) -> str | None:
        """Why these settings cannot be served, in words; None when they can."""
        host = self.host.strip()
        if not host or any(c.isspace() for c in host):
            return "give the address to listen on, e.g. 127.0.0.1 (this machine only)"
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            return "the port is a whole number from 1 to 65535 (0: any free port)"
        if not is_loopback(host) and not self.api_key.strip():
            return (f"serving on {host} makes the model reachable from other machines: give an API key, "
                    "so that only clients that send it can use the model")
        if self.upstream.strip() and not _URL.match(self.upstream.strip()):
            return "the upstream is a server's base URL, e.g. http://127.0.0.1:8000/v1"
        top = self.upstream_top_n
        if top is not None and (not isinstance(top, int) or not 0 <= top <= TOP_LOGPROBS_MAX):
            return f"the alternatives asked of the upstream are a whole number from 0 to {TOP_LOGPROBS_MAX}"
        return None

    def remembered(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "upstream": self.upstream, "upstream_top_n": self.upstream_top_n}


@dataclass(frozen=True)
class ServeState:
    """What the window shows: serving or not, where, what; `message` says why it stopped or failed."""

    running: bool = False
    url: str = ""
    what: str = ""  # the model served, or "upstream URL"
    starting: bool = False
    message: str = ""

    @property
    def status_text(self) -> str:
        return f"Serving on {self.url}" if self.running else ""


class ServeController:
    """Starts and stops the window's server and records what it serves."""

    def __init__(self, library: Library, host: EngineHost, options: Any = None):
        """`options`: an `engine.ServeOptions` (None: the server's defaults: top-20 and stage records per token)."""
        self.library = library
        self.host = host
        self.options = options
        self.state = ServeState()
        self.server: Any = None  # engine.RunningServer while serving
        self.recorder: ServedConversations | None = None
        self.changed = Signal()  # (ServeState)
        self.started = Signal()  # (Conversation) a served request's conversation appeared
        self.ended = Signal()  # (Conversation) ... and its answers are complete
        self.problem = Signal()  # (str) something about serving the user should know
        self._tasks: set[asyncio.Task] = set()
        self._proxy = False  # serving forwards to an upstream server, not the loaded model
        self._start_done: asyncio.Future | None = None  # resolves when the start under way has ended
        # Starting (bind, wait until up), stopping (join the server's thread) and Stop on one answer block for a
        # moment: on this thread of our own. Not the loop's default executor (qasync's QThreads, which Qt
        # complains about at exit) and not the host's (closing the window shuts that down first).
        self._blocking = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logitlab-serve-control")
        host.model_changed.connect(self._on_model_changed)

    def detach(self) -> None:
        """The window closed (serving was stopped first)."""
        self.host.model_changed.disconnect(self._on_model_changed)
        self._blocking.shutdown(wait=False)

    async def _off_loop(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await run_off_thread(lambda _state: fn(*args, **kwargs), executor=self._blocking)  # app/controllers/off_thread.py

    @property
    def running(self) -> bool:
        return self.server is not None

    def saved_settings(self) -> ServeSettings:
        doc = self.library.store.get_setting(SETTINGS_KEY) or {}
        try:
            top = doc.get("upstream_top_n")
            return ServeSettings(str(doc.get("host") or "127.0.0.1"), int(doc.get("port", DEFAULT_PORT)), "",
                                 str(doc.get("upstream") or ""), None if top is None else int(top))
        except (TypeError, ValueError, AttributeError):
            return ServeSettings()

    async def start(self, settings: ServeSettings) -> ServeState:
        """Serve the loaded model (or forward to `settings.upstream`); raises ServeError saying why not."""
        if self.running or self.state.starting:
            raise ServeError(f"already serving on {self.state.url}: stop it first")
        problem = settings.problem()
        if problem:
            raise ServeError(problem)
        upstream = settings.upstream.strip() or None
        engine = None if upstream else self.host.engine
        if engine is None and upstream is None:
            raise ServeError("no model is loaded: open one from Model ▸ Open model…, or give an upstream server")
        self._set(ServeState(starting=True))
        self._start_done = done = asyncio.get_running_loop().create_future()
        try:
            return await self._start(settings, upstream, engine)
        finally:
            done.set_result(None)

    def _options(self, settings: ServeSettings, upstream: str | None, make_options: Callable[[], Any]) -> Any:
        """The server's options: the controller's (tests) or the defaults, with the dialog's upstream top N."""
        options = self.options or make_options()
        if upstream is None or settings.upstream_top_n is None:
            return options
        return dataclasses.replace(options, upstream_top_n=settings.upstream_top_n)

    async def _start(self, settings: ServeSettings, upstream: str | None, engine: Any) -> ServeState:
        # Imported here: the server's web stack (uvicorn, Starlette) loads when serving starts, not with the window.
        from engine import ServeOptions, ServeSetupError, start_server

        try:
            info = engine.info if engine is not None else None
            fmt = await self.host.off_ui_thread(model_reasoning_format, engine) if engine is not None else None
            recorder = ServedConversations(self.library, model=info, reasoning_format=fmt)
            # Binding and waiting for the server to be up take a moment: not on the UI thread.
            server = await self._off_loop(
                start_server, engine, settings.host.strip(), settings.port, settings.api_key.strip() or None,
                recorder, upstream=upstream, options=self._options(settings, upstream, ServeOptions))
        except (ServeSetupError, OSError, ValueError) as e:
            self._set(ServeState(message=describe_error(e)))
            raise ServeError(describe_error(e)) from None
        except BaseException:
            self._set(ServeState())
            raise
        self.server, self.recorder, self._proxy = server, recorder, upstream is not None
        recorder.started.connect(self.started.emit)
        recorder.ended.connect(self.ended.emit)
        recorder.problem.connect(self.problem.emit)
        self.library.store.put_setting(SETTINGS_KEY, settings.remembered())
        what = f"upstream {upstream}" if upstream else (info.name if info is not None else "")
        self._set(ServeState(True, server.url, what))
        log.info("serving %s on %s", what, server.url)
        return self.state

    async def stop(self, reason: str = "") -> None:
        """Stop serving: answers under way end (each client's stream gets its last chunk), the thread ends."""
        if self._start_done is not None and not self._start_done.done():
            await asyncio.shield(self._start_done)  # a start under way (the window closing meanwhile): then stop it
        server, recorder = self.server, self.recorder
        if server is None:
            return
        self.server = None
        try:
            await self._off_loop(server.stop)
        finally:
            if recorder is not None:
                recorder.drain(reason or "serving stopped")  # what the server said last is written now
            self.recorder = None
            self._set(ServeState(message=reason))
            log.info("stopped serving on %s%s", server.url, f" ({reason})" if reason else "")

    def end_answers(self, timeout_s: float = 1.0) -> int:
        """End every served answer under way or waiting, now, as Stop does (each client's stream gets its end);
        returns how many. For the window's close event (app/lifecycle.py): called before the model's work is
        cancelled, so no waiting request reaches a model that is going away. Blocks for the server's reply
        (milliseconds: its loop only sets a flag per answer), at most `timeout_s` per call."""
        server = self.server
        if server is None:
            return 0
        ended = 0
        try:
            for answer_id in server.active_requests(timeout_s):
                ended += bool(server.stop_request(answer_id, timeout_s))
        except Exception:  # noqa: BLE001 - closing goes on; stop() ends them all anyway
            log.warning("could not end the served answers before closing", exc_info=True)
        return ended

    def stop_now(self, reason: str) -> asyncio.Task | None:
        """`stop` as a task the controller keeps (a model switch, a signal)."""
        if self.server is None:
            return None
        task = asyncio.ensure_future(self.stop(reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def live_answer(self, conv: Conversation | None) -> str | None:
        """The served answer streaming into `conv` (its id), else None."""
        return self.recorder.live_id(conv) if self.recorder is not None else None

    async def stop_answer(self, conv: Conversation | None) -> bool:
        """The window's Stop on a served conversation: its client's stream ends with a last chunk. False when
        no served answer streams into it."""
        answer_id, server = self.live_answer(conv), self.server
        if answer_id is None or server is None:
            return False
        return bool(await self._off_loop(server.stop_request, answer_id))

    def _on_model_changed(self, _info: Any) -> None:
        if self.server is not None and not self._proxy:  # a proxy serves another server: it goes on
            self.end_answers()  # now: a request waiting for its turn must not reach the old model's closed thread
            self.stop_now("another model was loaded")
            self.problem.emit("Serving stopped: another model was loaded (Model ▸ Serve… serves it)")

    def _set(self, state: ServeState) -> None:
        self.state = state
        self.changed.emit(state)
