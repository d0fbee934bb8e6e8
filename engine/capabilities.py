"""What only some backends can do: typed, optional protocols beside `Backend`.

`Backend` (engine/backend.py) stays at its five methods. A backend that
can do more implements one of these protocols in its own package, and a
caller asks for it by type, never by the backend's name::

    runner = require(backend, BatchRunners, "beam search").batch_runner()
    if isinstance(backend, PositionRunners): ...

`require` raises `MissingCapabilityError`, a one-line message that says what
the caller wanted and which model cannot do it, so the user reads words, not
an AttributeError.

| protocol          | what it gives                                            | who has it                     |
|-------------------|----------------------------------------------------------|--------------------------------|
| `BatchRunners`    | a runner for many sequences at once (research API, beams, N continuations) | torch, MLX, llama.cpp, remote |
| `PositionRunners` | every position's logits of one sequence (scoring)       | torch, MLX, llama.cpp          |
| `OwnEvents`       | the model's own event stream (server sampling, notes)    | remote                         |
| `RoundTrip`       | the latest request's network round trip                  | remote                         |
| `ServerChildren`  | N server-sampled continuations in one request (the API's `n`) | remote                  |
| `LayerLens`       | each layer's prediction at a position (logit lens), attention | torch, MLX, llama.cpp     |
| `ByteVocabulary`  | (a tokenizer's) every token as bytes, special ones named (grammar masks) | HF tokenizer (torch, MLX), llama.cpp |
| `OverlappedForward` | a forward run while the caller works (the last token's report) | llama.cpp, MLX, torch |
| `SamplesOnDevice` | logits kept on its accelerator and the sampler chain run there (only the report crosses) | torch |
| `BackgroundStep`  | (a batch runner's) step run on a helper thread while the caller works (the loom's reports) | llama.cpp |
| `StartsFromBackendCache` | (a batch runner's) first row begun from the backend's own cache of its prefix | llama.cpp, torch |
| `Steerable`       | a direction added to chosen layers' outputs (steering, control vectors), and logits under any steering | llama.cpp, torch, MLX |
| `ResidualStates`  | every layer's output at a sequence's last token (training steering vectors) | llama.cpp, torch, MLX |
| `NumericFacts`    | its libraries' versions and the settings that change the numbers (an answer's fingerprint) | llama.cpp, torch, MLX, remote |
| `RecordsCacheSchedule` | the forward calls its cache's positions came from (an exact replay computes them the same way) | llama.cpp |
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from engine.errors import EngineError

if TYPE_CHECKING:
    from engine.events import Event
    from engine.fingerprints.record import NumericSetup
    from engine.layer_capture import LayerCapture
    from engine.request import GenerationRequest
    from engine.steering.settings import Steering
    from engine.steering.shape import ResidualShape

RowState = Any  # one sequence's KV state, backend-specific; `state_nbytes` measures it


class MissingCapabilityError(EngineError):
    """The loaded model cannot do what was asked (e.g. score every position on a server)."""


class BatchRunner(Protocol):
    """Several sequences in one KV cache; every move returns last-position logits, float32 (B, V).

    `start` prefills prompts, `step` adds one token per row, `reorder` keeps the
    rows beam search picked; `forward_rows` extends rows that each continue
    their own cached prefix state (the token trie's) in one forward.
    `forward_calls` counts model calls, so tests can check batching batches; `pad_id` fills the left of
    shorter prompts; `reused_prompt_tokens`, after `start`, says per prompt how many of its first tokens
    were not computed for it (taken from the backend's cache, or a common beginning computed once for every
    row: llama.cpp), all zeros where each prompt ran in full. `close()` frees what the runner holds of its
    own (llama.cpp: its context, which must go before the model); call it on the backend's worker thread.
    """

    forward_calls: int
    pad_id: int
    reused_prompt_tokens: tuple[int, ...]

    def close(self) -> None: ...

    def start(self, prompts: Sequence[Sequence[int]]) -> np.ndarray: ...

    def step(self, tokens: Sequence[int]) -> np.ndarray: ...

    def reorder(self, rows: Sequence[int]) -> None: ...

    def supports_row_states(self) -> bool: ...

    def forward_rows(
        self, rows: Sequence[tuple[RowState | None, Sequence[int]]], keep_states: bool = True
    ) -> tuple[np.ndarray, list[RowState | None]]: ...

    def state_nbytes(self, state: RowState) -> int: ...


class PositionRunner(Protocol):
    """Every position's logits of one sequence, in chunks: teacher-forced scoring.

    Shares the backend's weights but not its KV cache; call it on the backend's
    worker thread and `close()` it before the backend closes.
    """

    forward_calls: int

    def close(self) -> None: ...

    def position_logits(self, ids: Sequence[int], first: int = 0, chunk: int | None = None
                        ) -> Generator[np.ndarray, None, None]:
        """Logits of positions `first`..T-1, as (n, V) float32 chunks in order (row t predicts t + 1)."""
        ...

    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """(T, V) float32 log-probs at every position of `ids`."""
        ...


@runtime_checkable
class InterruptibleForward(Protocol):
    """Can stop a forward part way, when asked from another thread (llama.cpp's abort callback)."""

    def forward_until(self, token_ids: Sequence[int], cancelled: Callable[[], bool]) -> np.ndarray | None:
        """`forward`, or None once `cancelled()` (polled from another thread) is true; what ran stays cached."""
        ...


@runtime_checkable
class BatchRunners(Protocol):
    """Can run a batch of sequences (the research API, beam search, N continuations from one prefix)."""

    def batch_runner(self) -> BatchRunner: ...


@runtime_checkable
class PositionRunners(Protocol):
    """Can give every position's logits of a sequence in one pass, instead of one forward per token."""

    def position_runner(self, n_tokens: int) -> PositionRunner:
        """A runner for one sequence of up to `n_tokens` tokens."""
        ...


@runtime_checkable
class OwnEvents(Protocol):
    """Makes its own event stream for a request instead of the shared decode loop over `forward`.

    A server model does: the server may sample (request.server_sampling), and
    what it reports (top N only) is noted on every event.
    """

    def events(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]: ...


@runtime_checkable
class ServerChildren(Protocol):
    """Can have its server sample several continuations of one prompt in one request (the OpenAI API's `n`).

    For a request the server samples (`request.server_sampling`). One request has one seed: every child reports
    the request's seed (`seeds[0]`), and the server draws the children from it. Where the server ignores or
    refuses `n`, the children it did not make run one request each, child r with `seeds[r]`.
    """

    def children_events(
        self, request: GenerationRequest, seeds: Sequence[int], cancel: threading.Event
    ) -> Iterator[tuple[int, Event]]:
        """(child, event) for children 0..len(seeds)-1: each child's TokenEvents in order, then one Done."""
        ...


@runtime_checkable
class RoundTrip(Protocol):
    """Its work happens elsewhere: the latest complete request's round trip is worth showing."""

    def round_trip_s(self) -> float | None:
        """Seconds the last complete request took (network and the server's work); None before the first."""
        ...


@runtime_checkable
class LayerLens(Protocol):
    """Can show what each of its layers predicts at a position (the logit lens) and where it attends."""

    def layer_capture(
        self, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 10, attention: bool = False
    ) -> list[LayerCapture]:
        """One `engine.lens.LayerCapture` per position (sorted), a position being a predicted token's index
        (1..len(token_ids)); computed on a context of its own, so the backend's KV cache is untouched."""
        ...


@runtime_checkable
class ByteVocabulary(Protocol):
    """Can list every token of its vocabulary as bytes (a grammar mask is computed over them).

    Asked of a backend's *tokenizer*. A server's tokenizer has no such list (each
    token would cost a request): a constraint then checks only the server's top N.
    """

    eos_token_ids: frozenset[int]

    def token_count(self) -> int:
        """How many token ids the vocabulary has (ids 0..count-1)."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes the token adds to the text (a special token: its text)."""
        ...

    def special_token_ids(self) -> frozenset[int]:
        """Tokens that are markup, not text (<|im_start|>, end of turn): a grammar never spells text with them."""
        ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


T = TypeVar("T")


@runtime_checkable
class OverlappedForward(Protocol):
    """Runs a forward while the caller's Python does other work."""

    def forward_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[np.ndarray, T]:
        """`forward(token_ids)` and `work()` at the same time; returns (the logits row, what `work` returned).

        The decode loop builds the report of token t (stage snapshots, top-N, entropy) while the model
        computes token t+1. Both have finished when this returns, also when either raised; `forward`'s
        exception wins. `work` must not touch the backend; the returned row is never written to again.
        """
        ...


class DeviceRows(Protocol):
    """One answer's decoding on the backend's device (`SamplesOnDevice.device_rows`).

    Attributes:
        chain: `SamplerChain`'s face for rows on the device (engine.sampling.torch_chain.OnDeviceChain):
            `choose(logits, history, ...)` takes a device row (or a host row, which it moves there),
            `state`, `restore` and `seed` as the numpy chain's.
    """

    chain: Any

    def forward(self, token_ids: Sequence[int]) -> Any:
        """`Backend.forward`, the (V,) row left on the device (never written to again)."""
        ...

    def forward_during(self, token_ids: Sequence[int], work: Callable[[], T]) -> tuple[Any, T]:
        """`OverlappedForward.forward_during` with the row left on the device."""
        ...


@runtime_checkable
class SamplesOnDevice(Protocol):
    """Logits that stay on the backend's accelerator, where the sampler chain runs (issue 49 item 1).

    Copying the whole (V,) row to the host each token and running the numpy chain there costs more than a
    fast GPU's step; on the device only the token's report (a few dozen numbers) crosses, once.
    """

    def device_rows(self, settings: Any, vocab: Any, constraint: Any = None) -> DeviceRows | None:
        """An answer's device decoding for these `SamplerSettings` and its constraint stage (a `GrammarStage`,
        or None), or None: the numpy chain on host rows then (the rows are on the host already, or the
        settings need what the device chain does not take)."""
        ...


@runtime_checkable
class BackgroundStep(Protocol):
    """(A BatchRunner:) runs a step on a helper thread while the caller's Python works."""

    def step_in_background(self, tokens: Sequence[int]) -> Future[np.ndarray]:
        """`step(tokens)` on the runner's helper thread; the future's result is its (B, V) logits.

        The loom builds the reports of this step's tokens while the model computes the next one. Until the
        future is done the caller must not use the runner; `close` waits for it.
        """
        ...


@runtime_checkable
class ScoresAhead(Protocol):
    """(A PositionRunners runner:) its forward leaves a CPU free and releases the GIL, so batch scoring may run
    the next text's forward on a helper thread while it reports this one (engine/experiments/batch_score.py)."""

    def leaves_a_core_free(self) -> bool:
        """Whether the coming call's threads leave a CPU free (asked per call: the free cores change)."""
        ...


@runtime_checkable
class AdmitsRows(Protocol):
    """(A BatchRunner:) new rows join a batch that is already decoding (a server's continuous batching)."""

    def admit(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        """Prefill each prompt as a new row after the rows there now (row B + i holds `prompts[i]`); returns
        their (len(prompts), V) last-position logits. The rows already there keep their caches and positions,
        and compute what they would have without the newcomers."""
        ...


@runtime_checkable
class JoinableBatches(Protocol):
    """(A BatchRunners backend:) its batch runners admit rows while they decode (`AdmitsRows`), so a server
    can run a lone request as a batch that later ones join; a runner is made only on the worker thread."""

    def batch_runners_admit_rows(self) -> bool: ...


@runtime_checkable
class StartsFromBackendCache(Protocol):
    """(A BatchRunner:) begins one row from the keys and values the backend already holds for its prefix."""

    def start_from_backend_cache(self, prompt: Sequence[int]) -> tuple[np.ndarray, int]:
        """`start([prompt])`, the prompt's first tokens taken from the backend's cache where it holds them;
        returns the (1, V) logits and how many tokens were taken rather than computed. Runs on the backend's
        worker thread (the backend's cache is read)."""
        ...


@runtime_checkable
class RecordsCacheSchedule(Protocol):
    """Says in which forward calls its cache's positions were computed (engine/cache_schedule.py): where a batch's
    size changes the numbers (llama.cpp's CPU kernels), an answer repeats bit for bit only when its prompt's
    cache is computed in the same pieces. `engine.backend.prefill` does that when asked."""

    def cache_schedule(self, upto: int) -> "tuple[tuple[int, int], ...]":
        """The (computed, kept) pieces of the first `upto` cached positions, in order."""
        ...


@runtime_checkable
class NumericFacts(Protocol):
    """Can say what it computes with: its libraries' versions and the settings that change the numbers."""

    def numeric_facts(self) -> NumericSetup:
        """Asked when an answer ends (threads may be chosen per answer): e.g. llama-cpp-python's version,
        n_threads, n_batch, n_ubatch, flash attention; torch's and transformers' versions, dtype, threads."""
        ...


@runtime_checkable
class Steerable(Protocol):
    """Can add a direction to the outputs of chosen decoder layers (steering: llama.cpp's control vectors).

    Layer i's output gets `Steering.combined(shape)[i]` added at every position (engine/steering/settings.py).
    Everything runs on the backend's worker thread.
    """

    def residual_shape(self) -> ResidualShape:
        """The model's layer count, residual width and architecture, which a vector must match."""
        ...

    def set_steering(self, steering: Steering | None) -> None:
        """Steer the backend's own forwards from the next one on; None or an inactive Steering: none.

        Checked against `residual_shape()` first (SteeringError in words, nothing changed). When the steering's
        `key()` differs from the one the cached tokens were computed under, the cache is dropped
        (`trim_cache(0)`): a steered prefix's keys and values differ from an unsteered one's. The same key
        keeps the cache.
        """
        ...

    def current_steering(self) -> Steering | None:
        """The steering the backend's forwards run under now (None: none)."""
        ...

    def steered_logits(self, token_ids: Sequence[int], positions: Sequence[int],
                       steering: Steering | None) -> np.ndarray:
        """(P, V) float32 logits predicting each of `positions` (sorted; a position is a predicted token's index,
        1..len(token_ids)) under `steering` (None: unsteered), computed on a context of its own, so the
        backend's KV cache and its own steering are untouched."""
        ...


@runtime_checkable
class ResidualStates(Protocol):
    """Can read every decoder layer's output at the last token of a sequence (steering vectors are trained on them)."""

    def last_token_states(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """(N, n_layer, n_embd) float32: each sequence's layer outputs at its last token, unsteered (row i is
        decoder layer i's output, where `Steerable` adds layer i's direction), on a context of its own."""
        ...


C = TypeVar("C")


def require(backend: object, capability: type[C], purpose: str) -> C:
    """`backend` as `capability`, or MissingCapabilityError saying that `purpose` needs what this model lacks."""
    if isinstance(backend, capability):
        return backend
    info = getattr(backend, "info", None)
    where = f"{info.name} ({info.backend})" if info is not None else type(backend).__name__
    what = (capability.__doc__ or capability.__name__).strip().splitlines()[0].rstrip(".")
    raise MissingCapabilityError(f"{purpose} needs a model that {what[0].lower()}{what[1:]}; {where} cannot")
