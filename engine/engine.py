"""`Engine`: a loaded model on its own worker thread, with sync and asyncio ways to generate."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from engine.backends.base import Backend
from engine.events import Done, Event, GenerationStats
from engine.open_model import load_model
from engine.model_info import ModelInfo
from engine.request import GenerationRequest
from engine.worker import EventCallback, GenerationHandle, ModelWorker

if TYPE_CHECKING:
    from engine.experiments import CompareResult, ScoreResult
    from engine.steering import PairSet, ResidualShape, Steering, SteeringEffect, SteeringShadow, SteeringVector
    from engine.sampling.settings import SamplerSettings

T = TypeVar("T")


class Engine:
    """Owns one model. Create with `Engine.load(...)` (blocking) or `Engine.start(...)` (background)."""

    def __init__(self, worker: ModelWorker):
        self._worker = worker

    @classmethod
    def start(cls, spec: str | None = None, **load_kwargs) -> "Engine":
        """Begin loading on the worker thread and return at once; see `ready` / `wait_ready`."""
        return cls(ModelWorker(lambda: load_model(spec, **load_kwargs)))

    @classmethod
    def load(cls, spec: str | None = None, **load_kwargs) -> "Engine":
        """Load and wait; load errors are raised here. Arguments as `engine.load_model`."""
        engine = cls.start(spec, **load_kwargs)
        try:
            engine.wait_ready()
        except BaseException:
            # Ctrl-C while loading: a load cannot be interrupted, so its thread is left to finish (and
            # release the model) on its own rather than holding the caller for the rest of the load.
            engine.close(timeout=0, cancel=True)
            raise
        return engine

    @classmethod
    def from_backend(cls, backend: Backend) -> "Engine":
        """Wrap an already loaded backend (it is used only from the worker thread from now on)."""
        return cls(ModelWorker(lambda: backend))

    @property
    def ready(self) -> Future:
        return self._worker.ready

    def wait_ready(self, timeout: float | None = None) -> Backend:
        return self._worker.wait_ready(timeout)

    @property
    def info(self) -> ModelInfo:
        return self.wait_ready().info

    @property
    def tokenizer(self):
        """The tokenizer (thread-safe for encode/decode)."""
        return self.wait_ready().tokenizer

    @property
    def round_trip_s(self) -> float | None:
        """Remote models: seconds the server's last complete answer took (network and its work); else None.

        Never waits: None while loading or after a failed load.
        """
        ready = self._worker.ready
        if not ready.done() or ready.exception() is not None:
            return None
        from engine.servers import round_trip_s

        return round_trip_s(ready.result())

    def call(self, fn: Callable[[Backend], T]) -> Future[T]:
        return self._worker.call(fn)

    def submit(self, request: GenerationRequest, on_event: EventCallback) -> GenerationHandle:
        return self._worker.submit(request, on_event)

    def generate(self, request: GenerationRequest) -> Iterator[Event]:
        """Blocking iteration over the events of one generation; closing the iterator cancels it."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        handle = self.submit(request, events.put)
        try:
            while True:
                event = events.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, Done):
                    return
        finally:
            handle.cancel()

    def complete(self, request: GenerationRequest) -> GenerationStats:
        """Run to the end and return the stats (text, token ids, timings)."""
        for event in self.generate(request):
            if isinstance(event, Done):
                return event.stats
        raise AssertionError("a generation always ends with Done")

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """`async for event in engine.stream(req)`: TokenEvents, then Done.

        Events are handed to the loop with `call_soon_threadsafe`; leaving the
        loop early (break, task cancelled) cancels the generation.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def deliver(event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        handle = self.submit(request, deliver)
        try:
            while True:
                event = await events.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, Done):
                    return
        finally:
            handle.cancel()

    # -- sampling experiments (engine.experiments) -------------------------------------------

    def score(
        self,
        text_or_ids: "str | Sequence[int]",
        *,
        context: int | None = None,
        top_n: int = 10,
        cancel: "threading.Event | None" = None,
    ) -> "ScoreResult":
        """Teacher-forced scoring of a text or token ids (see `engine.experiments.score`); blocking."""
        from engine.experiments.score import score

        stop = cancel or threading.Event()
        return self.call(lambda b: score(b, text_or_ids, context=context, top_n=top_n, cancelled=stop.is_set)).result()

    def compare(
        self,
        prompt: "str | GenerationRequest",
        settings: "Sequence[SamplerSettings]",
        *,
        seed: int | None = None,
        cancel: "threading.Event | None" = None,
        **request_kwargs,
    ) -> "CompareResult":
        """Run one prompt under several sampler settings with a shared seed (see `engine.experiments.compare`).

        `prompt` is raw text or a full `GenerationRequest` (its sampler is replaced per column);
        `request_kwargs` (max_new_tokens, top_n, record_stages, ...) build the request from text.
        """
        from engine.experiments.compare import compare

        request = prompt if isinstance(prompt, GenerationRequest) else GenerationRequest(prompt=prompt, **request_kwargs)
        return self.call(lambda b: compare(b, request, list(settings), seed=seed, cancel=cancel)).result()

    # -- steering (engine.steering): each runs on the model's worker thread, between answers; blocking ------

    def residual_shape(self) -> "ResidualShape | None":
        """The layer count and width a steering vector must have for this model; None when it cannot steer."""
        from engine.capabilities import Steerable

        return self.call(lambda b: b.residual_shape() if isinstance(b, Steerable) else None).result()

    def steering_effect(
        self, token_ids: Sequence[int], position: int, steering: "Steering", *, top_k: int = 10
    ) -> "SteeringEffect":
        """What `steering` did to the token at `position` (see `engine.steering.steering_effect`); the chat's
        cache is untouched."""
        from engine.steering.effect import steering_effect

        return self.call(lambda b: steering_effect(b, token_ids, position, steering, top_k=top_k)).result()

    def unsteered_shadow(self, token_ids: Sequence[int], first: int, steering: "Steering") -> "SteeringShadow":
        """An answer (`token_ids[first:]`) scored with and without `steering`: per token KL and log-probs."""
        from engine.steering.effect import unsteered_shadow

        return self.call(lambda b: unsteered_shadow(b, token_ids, first, steering)).result()

    def train_steering_vector(
        self,
        pairs: "PairSet",
        *,
        method: str = "pca",
        name: str | None = None,
        cancel: "threading.Event | None" = None,
        progress: "Callable[[int, int], None] | None" = None,
    ) -> "SteeringVector":
        """A steering vector for this model from contrastive `pairs` (see `engine.steering.train_vector`).

        `progress(done, total)` is called on the worker thread; setting `cancel` stops between batches."""
        from engine.steering.train import train_vector

        stop = cancel or threading.Event()
        return self.call(lambda b: train_vector(b, pairs, method=method, name=name, cancelled=stop.is_set,
                                                progress=progress)).result()

    def close(self, timeout: float | None = 10.0, *, cancel: bool = False) -> bool:
        """Release the model after queued work (waiting at most `timeout` s); True when its thread has ended.

        `cancel=True` (Ctrl-C, closing the window) cancels queued and running work and waits at most
        `engine.worker.CANCEL_WAIT_S`; a load still under way is left to finish, then released.
        """
        return self._worker.close(timeout, cancel=cancel)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # Leaving on an error or Ctrl-C: whatever is still queued or running is not wanted any more.
        self.close(cancel=exc_type is not None)
