"""`Engine`: a loaded model on its own worker thread, with sync and asyncio ways to generate."""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from engine.backend import Backend
from engine.events import Done, Event, GenerationStats
from engine.open_model import load_model
from engine.model_info import ModelInfo
from engine.request import GenerationRequest
from engine.tokenizer import TokenizerLike
from engine.worker import EventCallback, GenerationHandle, ModelWorker

if TYPE_CHECKING:
    from engine.documents import AnswerAttention, Passage
    from engine.events import TokenEvent
    from engine.experiments import CompareResult, ScoreResult
    from engine.experiments.audit import LoomAudit
    from engine.fingerprints.record import Fingerprint
    from engine.lens import LayerCapture
    from engine.decode.step import StepGate
    from engine.loom import RowEvent
    from engine.steering import PairSet, ResidualShape, Steering, SteeringEffect, SteeringShadow, SteeringVector
    from engine.sampling.settings import SamplerSettings

T = TypeVar("T")


class Engine:
    """Owns one model. Create with `Engine.load(...)` (blocking) or `Engine.start(...)` (background)."""

    def __init__(self, worker: ModelWorker):
        self._worker = worker
        self._loaded: Future[ModelInfo] = Future()
        worker.ready.add_done_callback(functools.partial(_resolve_loaded, self._loaded))

    @classmethod
    def start(cls, spec: str | None = None, **load_kwargs: Any) -> "Engine":  # load_kwargs: load_model's
        """Begin loading on the worker thread and return at once; see `ready` / `wait_ready`."""
        return cls(ModelWorker(lambda: load_model(spec, **load_kwargs)))

    @classmethod
    def load(cls, spec: str | None = None, **load_kwargs: Any) -> "Engine":
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
    def loaded(self) -> "Future[ModelInfo]":
        """Resolves to the model's `ModelInfo` once it is loaded (a failed load: its error). The way to wait for a
        load without being handed the backend, as `ready` and `wait_ready` hand it (the window never holds one)."""
        return self._loaded

    @property
    def is_loaded(self) -> bool:
        """Loaded, without an error (never waits): the tokenizer and `info` answer at once."""
        ready = self._worker.ready
        return ready.done() and not ready.cancelled() and ready.exception() is None

    @property
    def info(self) -> ModelInfo:
        return self.wait_ready().info

    @property
    def tokenizer(self) -> TokenizerLike:
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
        """Run `fn(backend)` on the model's worker thread: for engine code, the CLI and benchmarks. The window
        never does (tests/app/test_boundaries.py): it asks for what it needs by name (the `start_*` methods)."""
        return self._worker.call(fn)

    @property
    def has_queued_work(self) -> bool:
        """Whether work waits for the model behind what it runs now (the window's chat behind a server's batch)."""
        return self._worker.has_queued_work

    def submit(self, request: GenerationRequest, on_event: EventCallback, *,
               step: "StepGate | None" = None) -> GenerationHandle:
        """Queue a generation; `on_event` gets every event on the worker thread.

        `step`: step mode (engine.loom.StepGate) -- the decode loop waits at every distribution for the
        gate's pick; for models that run here through the shared decode loop (refused in words otherwise).
        """
        if step is not None:
            from engine.decode.step import SteppedEngine

            return SteppedEngine(self, step).submit(request, on_event)
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

        def deliver(event: Event | BaseException) -> None:
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
        return self.start_score(text_or_ids, context=context, top_n=top_n, cancel=cancel).result()

    def start_score(
        self,
        text_or_ids: "str | Sequence[int]",
        *,
        context: int | None = None,
        top_n: int = 10,
        cancel: "threading.Event | None" = None,
    ) -> "Future[ScoreResult]":
        """`score`, started on the worker; returns at once (setting `cancel` stops between positions)."""
        from engine.experiments.score import score

        stop = cancel or threading.Event()
        return self.call(lambda b: score(b, text_or_ids, context=context, top_n=top_n, cancelled=stop.is_set))

    def compare(
        self,
        prompt: "str | GenerationRequest",
        settings: "Sequence[SamplerSettings]",
        *,
        seed: int | None = None,
        cancel: "threading.Event | None" = None,
        **request_kwargs: Any,  # GenerationRequest's fields
    ) -> "CompareResult":
        """Run one prompt under several sampler settings with a shared seed (see `engine.experiments.compare`).

        `prompt` is raw text or a full `GenerationRequest` (its sampler is replaced per column);
        `request_kwargs` (max_new_tokens, top_n, record_stages, ...) build the request from text.
        """
        from engine.experiments.compare import compare

        request = prompt if isinstance(prompt, GenerationRequest) else GenerationRequest(prompt=prompt, **request_kwargs)
        return self.call(lambda b: compare(b, request, list(settings), seed=seed, cancel=cancel)).result()

    # -- the layer view (engine.lens) and the loom (engine.loom): on the worker, between answers; at once ------

    def start_layer_capture(self, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 8,
                            attention: bool = False) -> "Future[list[LayerCapture]]":
        """The layer view (logit lens) of `positions` of `token_ids`, with the attention over each when
        `attention` (see `engine.lens.capture`); MissingCapabilityError in words for a model without one."""
        from engine.lens import capture

        return self.call(lambda b: capture(b, token_ids, positions, top_k=top_k, attention=attention))

    def start_answer_attention(self, token_ids: Sequence[int], positions: Sequence[int],
                               passages: "Sequence[Passage]") -> "Future[AnswerAttention]":
        """The whole answer's attention on the attached passages, per token and layer (the per-passage bar;
        see `engine.documents.whole_answer`); MissingCapabilityError in words without a layer view."""
        from engine.documents import answer_attention

        return self.call(lambda b: answer_attention(b, token_ids, positions, passages))

    def start_loom_rows(self, request: GenerationRequest, n: int, on_event: "Callable[[RowEvent], None]", *,
                        mode: str = "sample", cancel: "threading.Event | None" = None) -> "Future[None]":
        """N continuations of `request` (batched where the model can; see `engine.loom.continuation_events`).

        `on_event` gets every row's events on the worker thread, each row ending with its Done (whose stats
        carry the row's fingerprint, marked as one of `n` rows); the future ends after the last one, or with
        the error that ended the rows. Setting `cancel` stops every row before its next token.
        """
        from engine.fingerprints.taking import rows_with_fingerprint
        from engine.loom import continuation_events

        def rows(backend: Backend) -> None:
            events = continuation_events(backend, request, n, mode=mode, cancel=cancel)  # type: ignore[arg-type]  # a str: refused in words
            for event in rows_with_fingerprint(backend, request, n, events):
                on_event(event)

        return self.call(rows)

    def start_audit_rows(self, rows: "Sequence[tuple[GenerationRequest, Sequence[TokenEvent], Fingerprint | None]]",
                         cancel: "threading.Event | None" = None,
                         progress: "Callable[[int, int], None] | None" = None) -> "Future[LoomAudit]":
        """Rerun loom rows one by one as single answers and compare (see `engine.experiments.audit.audit_rows`;
        `progress(done, total)` is called on the model's thread)."""
        from engine.experiments.audit import audit_rows

        return self.call(lambda b: audit_rows(b, rows, cancel, progress))

    # -- steering (engine.steering): each runs on the model's worker thread, between answers ----------------
    # The plain methods wait for the answer; their `start_*` forms return a Future at once (the window's).

    def residual_shape(self) -> "ResidualShape | None":
        """The layer count and width a steering vector must have for this model; None when it cannot steer."""
        return self.start_residual_shape().result()

    def start_residual_shape(self) -> "Future[ResidualShape | None]":
        from engine.capabilities import Steerable

        return self.call(lambda b: b.residual_shape() if isinstance(b, Steerable) else None)

    def steering_effect(
        self, token_ids: Sequence[int], position: int, steering: "Steering", *, top_k: int = 10
    ) -> "SteeringEffect":
        """What `steering` did to the token at `position` (see `engine.steering.steering_effect`); the chat's
        cache is untouched."""
        return self.start_steering_effect(token_ids, position, steering, top_k=top_k).result()

    def start_steering_effect(
        self, token_ids: Sequence[int], position: int, steering: "Steering", *, top_k: int = 10
    ) -> "Future[SteeringEffect]":
        from engine.steering.effect import steering_effect

        return self.call(lambda b: steering_effect(b, token_ids, position, steering, top_k=top_k))

    def unsteered_shadow(self, token_ids: Sequence[int], first: int, steering: "Steering") -> "SteeringShadow":
        """An answer (`token_ids[first:]`) scored with and without `steering`: per token KL and log-probs."""
        return self.start_unsteered_shadow(token_ids, first, steering).result()

    def start_unsteered_shadow(self, token_ids: Sequence[int], first: int, steering: "Steering", *,
                               cancel: "threading.Event | None" = None,
                               progress: "Callable[[int, int], None] | None" = None) -> "Future[SteeringShadow]":
        """`unsteered_shadow`, started on the worker; `progress(done, total)` answer tokens (on the worker thread)
        after each chunk; setting `cancel` stops before the next chunk (GenerationCancelled)."""
        from engine.steering.effect import unsteered_shadow

        stop = cancel or threading.Event()
        return self.call(lambda b: unsteered_shadow(b, token_ids, first, steering, cancelled=stop.is_set,
                                                    progress=progress))

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
        return self.start_train_steering_vector(pairs, method=method, name=name, cancel=cancel,
                                                progress=progress).result()

    def start_train_steering_vector(
        self,
        pairs: "PairSet",
        *,
        method: str = "pca",
        name: str | None = None,
        cancel: "threading.Event | None" = None,
        progress: "Callable[[int, int], None] | None" = None,
    ) -> "Future[SteeringVector]":
        from engine.steering.train import train_vector

        stop = cancel or threading.Event()
        return self.call(lambda b: train_vector(b, pairs, method=method, name=name, cancelled=stop.is_set,
                                                progress=progress))

    def close(self, timeout: float | None = 10.0, *, cancel: bool = False) -> bool:
        """Release the model after queued work (waiting at most `timeout` s); True when its thread has ended.

        `cancel=True` (Ctrl-C, closing the window) cancels queued and running work and waits at most
        `engine.worker.CANCEL_WAIT_S`; a load still under way is left to finish, then released.
        """
        return self._worker.close(timeout, cancel=cancel)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # Leaving on an error or Ctrl-C: whatever is still queued or running is not wanted any more.
        self.close(cancel=exc_type is not None)


def _resolve_loaded(loaded: "Future[ModelInfo]", ready: Future) -> None:
    """`ready` (the backend, or the load's error) ended: `loaded` gets the backend's `ModelInfo`, or the error."""
    if ready.cancelled():
        loaded.cancel()
    elif (error := ready.exception()) is not None:
        loaded.set_exception(error)
    else:
        try:
            loaded.set_result(ready.result().info)
        except BaseException as e:  # noqa: BLE001 - the info of a backend that cannot give it: said as the load's
            loaded.set_exception(e)
