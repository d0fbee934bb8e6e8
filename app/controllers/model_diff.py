"""Two models on one text, in the window: the second model, loaded for the comparison only, and the runs.

Qt-free, like the other controllers. `SecondModel` holds the model the loaded
(chat) model is compared against: loaded on its own worker thread when the user
picks it, replaced (the old one closed) when another is picked, closed when the
comparison window closes, so the window holds two models only while it is open.
`ModelDiffRun` compares the chat's model (A) with it (B) on a text
(engine.experiments.model_diff.compare_models, which runs each model on its own
worker thread; the waiting happens on a helper thread, never the UI's).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from engine import Engine, EngineError, GenerationCancelled, ModelInfo, experiments

from app.controllers.engine_host import EngineFactory, EngineHost, describe_error, start_engine
from app.controllers.experiment import ExperimentRun
from app.controllers.off_thread import TaskState, close_in_background, run_off_thread, to_loop
from app.state.observable import Signal

log = logging.getLogger(__name__)

DIFF_TOP_N = 5  # alternatives kept per token and model (the hover shows them)
# Where a comparison waits for the two models' threads (compare_models blocks until both are done).
_WAITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logitlab-model-diff")


@dataclass(frozen=True)
class MemoryLine:
    """What holding a model costs, as far as the engine can tell."""

    name: str
    weights_bytes: int  # ModelInfo.bytes: the weights as loaded
    cache_bytes: int  # llama.cpp's KV cache as allocated (0 where unknown or grown on demand)

    @classmethod
    def of(cls, info: ModelInfo) -> "MemoryLine":
        runtime = getattr(info, "runtime", None)
        return cls(f"{info.name} ({info.backend})", int(info.bytes or 0), int(getattr(runtime, "kv_cache_bytes", 0) or 0))

    @property
    def total(self) -> int:
        return self.weights_bytes + self.cache_bytes


class SecondModel:
    """The model B of a comparison; at most one at a time.

    Loading one can take minutes (a download, a conversion, a big file): `progress` says what the load is doing
    and how far (a fraction where the engine knows one), `progressed` follows it, and `cancel_load` stops it:
    the load's next progress report raises on its worker (a download or conversion ends there), and whatever
    it still finishes is closed at once.
    """

    def __init__(self, factory: EngineFactory = start_engine):
        self._factory = factory
        self.engine: Engine | None = None
        self.spec: str | None = None
        self.backend = "auto"
        self.loading = False
        self.error: str | None = None
        self.cancelled = False  # the last load was cancelled by the user
        self.progress: tuple[str, float | None] = ("", None)  # what the load under way does, and how far (0..1)
        self.started_at = 0.0  # loop time the load under way began (the view counts the seconds)
        self.changed = Signal()  # () loading began, ended, failed, or the model was closed
        self.progressed = Signal()  # () `progress` changed
        self._generation = 0  # a pick made while another loads wins; the older one is closed when it arrives
        self._cancel: threading.Event | None = None  # the load under way's: set, its next progress report raises

    async def load(self, spec: str | None, backend: str = "auto") -> bool:
        """Load `spec` as model B (the previous B is closed first, to free its memory); True when loaded."""
        self._generation += 1
        mine = self._generation
        self.close()
        if self._cancel is not None:
            self._cancel.set()  # an earlier pick still loading: it is not wanted any more
        cancel = self._cancel = threading.Event()
        loop = asyncio.get_running_loop()
        self.loading, self.error, self.cancelled, self.spec, self.backend = True, None, False, spec, backend
        self.progress, self.started_at = ("", None), loop.time()
        self.changed.emit()
        hop = to_loop(lambda message, fraction: self._on_progress(mine, message, fraction))

        def progress(message: str, fraction: float | None) -> None:  # the load's worker thread
            if cancel.is_set():
                raise GenerationCancelled("loading the second model was cancelled")
            hop(message, fraction)

        engine: Engine | None = None
        try:
            engine = self._factory(spec, backend, progress)
            await asyncio.wrap_future(engine.loaded)
        except asyncio.CancelledError:
            if engine is not None:
                _close_in_background(engine)
            cancel.set()
            raise
        except Exception as e:  # noqa: BLE001 - said in the window; model A is untouched
            if engine is not None:
                _close_in_background(engine)
            if mine == self._generation:
                log.warning("loading the second model %s failed: %s", spec, e, exc_info=not isinstance(e, EngineError))
                self.loading, self.error = False, describe_error(e)
                self.changed.emit()
            return False
        if mine != self._generation:  # another pick came meanwhile: this one is not wanted any more
            _close_in_background(engine)
            return False
        self.engine, self.loading = engine, False
        self.changed.emit()
        return True

    def _on_progress(self, generation: int, message: str, fraction: float | None) -> None:
        if generation == self._generation and self.loading:
            self.progress = (message, fraction)
            self.progressed.emit()

    def cancel_load(self) -> bool:
        """Stop the load under way: its next progress report raises on its worker, and what it still loads is
        closed when it arrives. True when one was under way."""
        if not self.loading or self._cancel is None:
            return False
        self._cancel.set()
        self._generation += 1  # what it loads after all is not wanted: closed when it arrives
        self.loading, self.cancelled, self.error = False, True, None
        self.changed.emit()
        return True

    @property
    def info(self) -> ModelInfo | None:
        return self.engine.info if self.engine is not None else None

    def close(self) -> None:
        """Release model B (its worker finishes what it runs first, off the UI thread)."""
        engine, self.engine = self.engine, None
        if engine is not None:
            _close_in_background(engine)
            self.changed.emit()


def _close_in_background(engine: Engine) -> None:
    close_in_background(engine.close, "logitlab-second-model-close")


class ModelDiffRun(ExperimentRun):
    """The chat's model (A) against the second model (B) on one text."""

    def __init__(self, text: str, second: SecondModel, top_n: int = DIFF_TOP_N):
        super().__init__()
        if not text.strip():
            raise ValueError("write or paste a text to compare the two models on")
        self.text = text
        self.second = second
        self.top_n = top_n
        self.result: experiments.ModelDiff | experiments.SpanModelDiff | None = None
        self._stop = threading.Event()  # read by both models' worker threads between chunks

    def cancel(self) -> None:
        super().cancel()
        self._stop.set()

    async def _run(self, host: EngineHost) -> None:
        engine_a = await host.wait_engine()
        engine_b = self.second.engine
        if engine_b is None:
            raise EngineError("load a second model to compare against first")
        text, top_n, stop = self.text, self.top_n, self._stop  # the work holds these, never the run itself

        def work(state: TaskState) -> experiments.ModelDiff | experiments.SpanModelDiff:
            return experiments.compare_models(engine_a, engine_b, text, top_n=top_n,
                                              cancelled=lambda: stop.is_set() or state.cancelled)

        # A pool of our own: qasync's default executor is made of QThreads, which Qt reports as destroyed while
        # running when the process ends during a comparison; the shared pool's two threads serve other work.
        self.result = await run_off_thread(work, executor=_WAITER)


def start_diff(host: EngineHost, second: SecondModel, text: str) -> ModelDiffRun:
    """A run under way (ValueError for an empty text, before anything starts)."""
    run = ModelDiffRun(text, second)
    run.start(host)
    return run
