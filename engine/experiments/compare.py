"""Compare sampler settings side by side: one prompt, 2+ settings, the same seed, aligned tokens.

Columns run one after another on the one model. Every run starts from the
same prompt, so `prefill` finds it in the KV cache and recomputes only its
last token (whose logits the first draw needs): the shared prompt is
computed once. With the same seed every column draws the same uniform
number at every step (see `engine.sampling.chain`), so the columns agree
until a step where the settings changed the survivors, and the first
divergence says where the settings started to matter.
"""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.backend import Backend
from engine.decode.loop import generate_events, prompt_ids_for
from engine.events import Done, GenerationStats, TokenEvent
from engine.fingerprints.taking import with_fingerprint
from engine.experiments.score import LN2
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

MAX_COLUMNS = 8
REPEAT_N = 3  # repeated n-grams are counted for this n


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """What one column's text looks like, in numbers.

    Attributes:
        length: generated tokens.
        mean_surprisal_bits: mean -log2 p(token) under the model, bits/token.
        mean_entropy: mean entropy of the model's distribution, nats.
        distinct_2: distinct bigrams / bigrams (0.0 with fewer than 2 tokens).
        repeated_ngrams: n-gram occurrences (n = `REPEAT_N`) that repeat an
            earlier one: total n-grams minus distinct n-grams.
        finish_reason: why the column ended.
        tokens_per_s: decode speed.
    """

    length: int
    mean_surprisal_bits: float
    mean_entropy: float
    distinct_2: float
    repeated_ngrams: int
    finish_reason: str
    tokens_per_s: float

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


def ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def distinct_n(ids: Sequence[int], n: int) -> float:
    """Distinct n-grams over all n-grams (Li et al. 2016); 0.0 when there is no n-gram."""
    grams = ngrams(ids, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def repeated_ngrams(ids: Sequence[int], n: int = REPEAT_N) -> int:
    """How many n-gram occurrences repeat an earlier one (0 for text that never repeats itself)."""
    counts = Counter(ngrams(ids, n))
    return sum(c - 1 for c in counts.values())


def column_stats(events: Sequence[TokenEvent], finish_reason: str, tokens_per_s: float) -> ColumnStats:
    ids = [e.token_id for e in events]
    n = len(events)
    return ColumnStats(
        length=n,
        mean_surprisal_bits=(-sum(e.logprob for e in events) / n / LN2) if n else 0.0,
        mean_entropy=(sum(e.entropy for e in events) / n) if n else 0.0,
        distinct_2=distinct_n(ids, 2),
        repeated_ngrams=repeated_ngrams(ids),
        finish_reason=finish_reason,
        tokens_per_s=tokens_per_s,
    )


def first_divergence(columns: Sequence[Sequence[int]]) -> int | None:
    """The first position where the columns' tokens differ (one ending counts); None if all are equal."""
    if len(columns) < 2:
        return None
    longest = max(len(c) for c in columns)
    for i in range(longest):
        if len({c[i] if i < len(c) else None for c in columns}) > 1:
            return i
    return None


def with_shared_seed(settings: Sequence[SamplerSettings], seed: int | None = None) -> list[SamplerSettings]:
    """Give every column without a seed the same one (`seed`, or a fresh one): same draws per step."""
    if seed is None:
        seed = next((s.seed for s in settings if s.seed is not None), None)
    if seed is None:
        seed = secrets.randbits(63)
    return [s if s.seed is not None else s.with_(seed=seed) for s in settings]


@dataclass(frozen=True)
class CompareColumn:
    settings: SamplerSettings  # as run (seed filled in)
    events: tuple[TokenEvent, ...]
    stats: GenerationStats
    summary: ColumnStats

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(e.token_id for e in self.events)


@dataclass(frozen=True)
class CompareResult:
    prompt_ids: tuple[int, ...]
    columns: tuple[CompareColumn, ...]
    first_divergence: int | None

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens actually computed over all columns (the rest came from the KV cache)."""
        return sum(c.stats.prefilled_tokens for c in self.columns)


def run_column(backend: Backend, request: GenerationRequest, cancel: threading.Event | None = None) -> CompareColumn:
    """One generation, collected: its events, stats and summary."""
    events: list[TokenEvent] = []
    stats: GenerationStats | None = None
    for ev in with_fingerprint(backend, request, generate_events(backend, request, cancel)):
        if isinstance(ev, Done):
            stats = ev.stats
        else:
            events.append(ev)
    assert stats is not None  # a generation always ends with Done
    settings = request.sampler if request.sampler.seed is not None else request.sampler.with_(seed=stats.seed)
    return CompareColumn(settings, tuple(events), stats,
                         column_stats(events, stats.finish_reason, stats.decode_tokens_per_s))


def compare(
    backend: Backend,
    request: GenerationRequest,
    settings: Sequence[SamplerSettings],
    *,
    seed: int | None = None,
    cancel: threading.Event | None = None,
) -> CompareResult:
    """Run `request` once per settings (columns without a seed share one) and align the results.

    Args:
        backend: the model.
        request: prompt, length, stop strings, top_n, record_stages; its
            `sampler` is replaced by each column's settings.
        settings: 2 to `MAX_COLUMNS` sampler settings.
        seed: the shared seed (default: the first column seed given, else a fresh one).
        cancel: stops the column running and skips the rest.
    """
    if not 2 <= len(settings) <= MAX_COLUMNS:
        raise ValueError(f"compare needs 2 to {MAX_COLUMNS} settings, got {len(settings)}")
    cancel = cancel or threading.Event()
    columns: list[CompareColumn] = []
    for s in with_shared_seed(settings, seed):
        if cancel.is_set():
            break
        columns.append(run_column(backend, replace(request, sampler=s), cancel))
    prompt = tuple(prompt_ids_for(backend.tokenizer, request))
    return CompareResult(prompt, tuple(columns), first_divergence([c.token_ids for c in columns]))
