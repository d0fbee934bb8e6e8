"""Owns the loaded model: loads a replacement in the background and keeps the old one if that fails.

`Engine.start` loads on the engine's own worker thread; progress callbacks
arrive on that thread and hop to the event loop through `app.controllers.off_thread.to_loop`
(qasync's rule: worker threads never touch the UI directly). Blocking calls the
window needs go through `app.controllers.off_thread` as well, on the host's own pool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from engine import Engine, EngineError, ModelInfo, RuntimeSettings

from app.controllers.off_thread import close_in_background, run_off_thread, start_off_thread, to_loop
from app.state.observable import Signal

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, "float | None"], None]
T = TypeVar("T")
EngineFactory = Callable[[str | None, str, ProgressFn], Engine]


def start_engine(
    spec: str | None, backend: str, progress: ProgressFn, trust_remote_code: bool = False, **runtime: int
) -> Engine:
    """The production factory: load `spec` with `backend` on a new worker thread.

    `trust_remote_code` only after the user confirmed the model's own code files (model picker);
    `runtime`: `RuntimeSettings.load_kwargs()` (context, threads, GPU layers, batch size).
    """
    return Engine.start(spec, backend=backend, progress=progress, trust_remote_code=trust_remote_code, **runtime)


class NoModelError(EngineError):
    """Nothing is loaded and nothing is loading."""


@dataclass(frozen=True)
class LoadState:
    loading: bool
    spec: str | None = None
    message: str = ""
    fraction: float | None = None


def describe_error(error: BaseException) -> str:
    """A message for a person: the engine's own for `EngineError`s and `ValueError`s (bad input, said in
    words: "the remote backend needs a server URL…"), the type and text otherwise."""
    if isinstance(error, (EngineError, ValueError)) and str(error).strip():
        return str(error)
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class EngineHost:
    """The current `Engine` (or None), its `ModelInfo`, and background (re)loading."""

    def __init__(self, factory: EngineFactory = start_engine):
        self._factory = factory
        self.engine: Engine | None = None
        self.info: ModelInfo | None = None
        self.spec: str | None = None
        self.backend: str = "auto"
        self.state = LoadState(False)
        self.last_error: BaseException | None = None  # why the last load failed (the window offers fixes by type)
        self._pending: asyncio.Future | None = None  # resolves when the load under way ends
        self._task: asyncio.Task | None = None  # the load under way
        self._closed = False
        self.state_changed = Signal()  # (LoadState)
        self.model_changed = Signal()  # (ModelInfo)
        self.load_failed = Signal()  # (spec, message)
        # Blocking engine calls the window needs (a chat template render, a tokenization): never on the UI
        # thread, where a slow or hostile template would freeze the window. Two threads: one stuck
        # job (up to the template's time limit) does not hold up the next send.
        self._blocking = ThreadPoolExecutor(max_workers=2, thread_name_prefix="logitlab-blocking")

    @property
    def loading(self) -> bool:
        return self.state.loading

    def load(
        self, spec: str | None, backend: str = "auto", trust_remote_code: bool = False,
        runtime: RuntimeSettings | None = None,
    ) -> "asyncio.Task[bool]":
        """Start loading `spec`; the task gives True when it is current, False when it failed.

        `runtime`: the context, threads, GPU layers and batch size to load with (None: the engine's choices).

        The host counts as loading from this call on (not from the task's first step),
        so a question sent right after start-up waits for this model.
        """
        if self.loading:
            raise RuntimeError("a model is already loading; wait for it to finish")
        loop = asyncio.get_running_loop()
        self._pending = loop.create_future()
        self._set_state(LoadState(True, spec, f"Loading {spec or 'the default model'}…", None))
        self._task = loop.create_task(self._load(spec, backend, loop, trust_remote_code, runtime))
        return self._task

    def cancel_load(self) -> bool:
        """Stop the load under way (a server that never answers); the current model stays. True if one was."""
        if self._task is None or self._task.done():
            return False
        self._task.cancel()
        return True

    async def _load(self, spec: str | None, backend: str, loop: asyncio.AbstractEventLoop,
                    trust_remote_code: bool = False, runtime: RuntimeSettings | None = None) -> bool:
        """Load `spec` and make it current; on failure keep the current model and return False."""
        assert self._pending is not None
        label = spec or "default model"

        hop = to_loop(self._on_progress, loop)  # dropped once the loop is closed: the window is gone

        def progress(message: str, fraction: float | None) -> None:  # worker thread
            hop(spec, message, fraction)

        new: Engine | None = None
        ok = False
        try:
            # Passed only when set, so factories that know nothing of remote code or runtime settings keep working.
            extra: dict[str, Any] = {"trust_remote_code": True} if trust_remote_code else {}
            extra.update(runtime.load_kwargs() if runtime is not None else {})
            new = self._factory(spec, backend, progress, **extra)
            ready = asyncio.wrap_future(new.loaded)  # its ModelInfo: the host never holds the backend
            try:
                # Shielded: cancel_load stops this wait, never the worker's own future (it sets that one itself).
                info = await asyncio.shield(ready)
            except asyncio.CancelledError:
                ready.add_done_callback(_ignore_outcome)  # how the abandoned load ends is of no interest now
                raise
            if self._closed:  # the window closed while we loaded
                return False
            old, self.engine, self.info, self.spec, self.backend = self.engine, new, info, spec, backend
            ok = True
            if old is not None:
                # A generation still running on the old model finishes first (close() drains its queue).
                _close_in_background(old)
            self._set_state(LoadState(False))
            self.model_changed.emit(info)
            return True
        except Exception as e:  # noqa: BLE001 - any failure must leave the old model in place
            log.warning("loading %s failed: %s", label, e, exc_info=not isinstance(e, EngineError))
            self.last_error = e
            self._set_state(LoadState(False))
            self.load_failed.emit(spec, describe_error(e))
            return False
        finally:
            if not ok and new is not None:
                _close_in_background(new)
            if self.loading:  # cancelled, or closed while loading
                self._set_state(LoadState(False))
            if not self._pending.done():
                self._pending.set_result(ok)

    async def wait_engine(self) -> Engine:
        """The engine to generate with; waits for a load under way when nothing is loaded yet."""
        if self.engine is None and self.loading and self._pending is not None:
            await asyncio.shield(self._pending)
        if self.engine is None:
            raise NoModelError("no model is loaded: open one from Model ▸ Open model…")
        return self.engine

    async def off_ui_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread; the result (or its exception) comes back on the event loop."""
        return await run_off_thread(lambda _state: fn(*args), executor=self._blocking)  # app/controllers/off_thread.py

    def run_off_ui_thread(self, job: Callable[[], T], done: Callable[[T | None, BaseException | None], None]) -> bool:
        """Start `job` on a worker thread; `done(result, error)` runs on the event loop when it ends.

        For callers that are not coroutines (a label that needs a count). False when there is no
        running event loop to come back to, or the pool was shut down with the model (nothing was started).
        """
        return start_off_thread(job, done, executor=self._blocking)  # app/controllers/off_thread.py

    def _on_progress(self, spec: str | None, message: str, fraction: float | None) -> None:
        if self.loading and spec == self.state.spec:
            self._set_state(LoadState(True, spec, message, fraction))

    def _set_state(self, state: LoadState) -> None:
        self.state = state
        self.state_changed.emit(state)

    def close(self, wait: bool = True) -> None:
        """Release the model (its worker finishes queued work first)."""
        self._closed = True
        self._blocking.shutdown(wait=False, cancel_futures=True)
        engine, self.engine = self.engine, None
        if engine is not None:
            if wait:
                engine.close()
            else:
                _close_in_background(engine)


def _ignore_outcome(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so asyncio does not log it as never retrieved


def _close_in_background(engine: Engine) -> None:
    # close() joins the worker, which may be mid-generation or mid-load: never on the UI thread.
    close_in_background(engine.close, "logitlab-engine-close")
