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
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from engine import Engine, EngineError, ModelInfo, experiments

from app.engine_host import EngineFactory, EngineHost, describe_error, start_engine
from app.controllers.experiment import ExperimentRun
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
    """The model B of a comparison; at most one at a time."""

    def __init__(self, factory: EngineFactory = start_engine):
        self._factory = factory
        self.engine: Engine | None = None
        self.spec: str | None = None
        self.backend = "auto"
        self.loading = False
        self.error: str | None = None
        self.changed = Signal()  # () loading began, ended, failed, or the model was closed
        self._generation = 0  # a pick made while another loads wins; the older one is closed when it arrives

    async def load(self, spec: str | None, backend: str = "auto") -> bool:
        """Load `spec` as model B (the previous B is closed first, to free its memory); True when loaded."""
        self._generation += 1
        mine = self._generation
        self.close()
        self.loading, self.error, self.spec, self.backend = True, None, spec, backend
        self.changed.emit()
        engine: Engine | None = None
        try:
            engine = self._factory(spec, backend, lambda _m, _f: None)
            await asyncio.wrap_future(engine.ready)
        except asyncio.CancelledError:
            if engine is not None:
                _close_in_background(engine)
            raise
        except Exception as e:  # noqa: BLE001 - said in the window; model A is untouched
            log.warning("loading the second model %s failed: %s", spec, e, exc_info=not isinstance(e, EngineError))
            if engine is not None:
                _close_in_background(engine)
            if mine == self._generation:
                self.loading, self.error = False, describe_error(e)
                self.changed.emit()
            return False
        if mine != self._generation:  # another pick came meanwhile: this one is not wanted any more
            _close_in_background(engine)
            return False
        self.engine, self.loading = engine, False
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
    threading.Thread(target=engine.close, name="logitlab-second-model-close", daemon=True).start()


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
        work = functools.partial(experiments.compare_models, engine_a, engine_b, self.text, top_n=self.top_n,
                                 cancelled=self._stop.is_set)
        # A plain thread of our own: qasync's default executor is made of QThreads, which Qt reports as
        # destroyed while running when the process ends during a comparison.
        self.result = await asyncio.get_running_loop().run_in_executor(_WAITER, work)


def start_diff(host: EngineHost, second: SecondModel, text: str) -> ModelDiffRun:
    """A run under way (ValueError for an empty text, before anything starts)."""
    run = ModelDiffRun(text, second)
    run.start(host)
    return run
