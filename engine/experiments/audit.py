"""Audit a loom: run its batched rows again one by one, and measure how far their log-probs moved.

The loom decodes N children as rows of one batch (engine/loom/continuations.py); a single answer
decodes alone. Both use the same seeds and the same sampler code, so where the backend computes a
row's logits the same way in a batch as alone, every row comes out identical, bit for bit. On
llama.cpp's CPU backend that is what we find; on a backend whose matmuls are split differently
by the batch's shape (torch on the CPU) the log-probs can differ in the last bits, and a draw
that lands near a boundary can then pick another token. The audit says which, row by row:
the largest |Δ log-prob| over the positions both runs share, and where a row diverged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from engine.backend import Backend
from engine.events import Done, GenerationStats, TokenEvent
from engine.experiments.replay import ReplayVerdict, as_recorded, replay_verdict
from engine.fingerprints.record import Fingerprint
from engine.fingerprints.taking import with_fingerprint
from engine.request import GenerationRequest


@dataclass(frozen=True)
class RowAudit:
    """One row: its seed, and how its single-answer rerun compares with the batched original."""

    row: int
    seed: int
    verdict: ReplayVerdict

    @property
    def max_logprob_diff(self) -> float:
        return self.verdict.max_logprob_diff


@dataclass(frozen=True)
class LoomAudit:
    rows: tuple[RowAudit, ...]
    asked: int = 0  # rows asked for (more than `rows` when it was stopped part way); 0: as many as it has

    @property
    def max_logprob_diff(self) -> float:
        """The largest |Δ log-prob| over every row (0.0: bit for bit the same everywhere)."""
        return max((r.max_logprob_diff for r in self.rows), default=0.0)

    @property
    def all_identical(self) -> bool:
        return all(r.verdict.identical for r in self.rows)

    @property
    def stopped(self) -> bool:
        return self.asked > len(self.rows)

    def summary(self) -> str:
        """One line: how many rows repeated, the largest difference, and the first recorded cause of one that did
        not ("14 of 16 rows repeated bit for bit; 2 diverged (row 3 at token 5); largest |Δ log-prob| 0.235 nats;
        why: decoded as one of 16 rows of a batch -> alone")."""
        n = len(self.rows)
        same = sum(r.verdict.identical for r in self.rows)
        diverged = [r for r in self.rows if r.verdict.kind == "diverged"]
        parts = [f"{same} of {n} rows repeated bit for bit" if n else "no row rerun"]
        if diverged:
            first = diverged[0]
            assert first.verdict.diverged_at is not None
            parts.append(f"{len(diverged)} diverged (row {first.row + 1} at token {first.verdict.diverged_at + 1})")
        within = n - same - len(diverged)
        if within:
            parts.append(f"{within} same tokens with other log-probs")
        parts.append(f"largest |Δ log-prob| {self.max_logprob_diff:.3g} nats")
        odd = next((r for r in self.rows if not r.verdict.identical), None)
        if odd is not None:
            changes = [c for c in (odd.verdict.fingerprint_changes or ()) if not c.startswith("n_threads")]
            parts.append("why: " + ("; ".join(changes) if changes else odd.verdict.fingerprint_text()))
        if self.stopped:
            parts.append(f"stopped after {n} of {self.asked} rows")
        return "; ".join(parts)

    def lines(self) -> list[str]:
        """The report: one line per row, then the overall figure."""
        out = [f"row {r.row} (seed {r.seed}): {r.verdict.headline()}; largest |Δ log-prob| {r.max_logprob_diff:.3g}"
               for r in self.rows]
        verdict = "every row identical" if self.all_identical else "not all rows identical"
        out.append(f"{len(self.rows)} rows; largest |Δ log-prob| {self.max_logprob_diff:.3g}; {verdict}")
        return out


def rerun_alone(backend: Backend, request: GenerationRequest, cancel: threading.Event | None = None
                ) -> tuple[list[TokenEvent], GenerationStats]:
    """`request` as a single answer through the decode loop (the cache cleared first, as a fresh answer)."""
    from engine.decode.loop import generate_events

    backend.trim_cache(0)
    events: list[TokenEvent] = []
    stats: GenerationStats | None = None
    for ev in with_fingerprint(backend, request, generate_events(backend, request, cancel or threading.Event())):
        if isinstance(ev, Done):
            stats = ev.stats
        else:
            events.append(ev)
    assert stats is not None  # a generation always ends with Done
    return events, stats


def forced_start(events: Sequence[TokenEvent]) -> tuple[int, ...]:
    """The row's leading forced tokens (the loom's "top" first token, a beam's whole path): forced again."""
    out = []
    for e in events:
        if not e.forced:
            break
        out.append(e.token_id)
    return tuple(out)


def audit_rows(
    backend: Backend,
    rows: Iterable[tuple[GenerationRequest, Sequence[TokenEvent], Fingerprint | None]],
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LoomAudit:
    """Rerun each (request with the row's seed, the row's events, its fingerprint) alone and compare with the row.

    The row's leading forced tokens are forced again; everything else is drawn with the row's seed.
    Runs on the backend's worker thread. `progress(done, total)` is called before each row and at the end (on
    the worker thread: hand it on); `cancel` stops the rerun under way before its next token, and the audit
    then holds the rows finished before it (`stopped`).
    """
    rows = list(rows)
    audits = []
    for r, (request, events, fingerprint) in enumerate(rows):
        if cancel is not None and cancel.is_set():
            break
        if progress is not None:
            progress(r, len(rows))
        # Its prompt computed in the pieces the row's was (the chat's cache the loom began from), where recorded.
        alone = as_recorded(replace(request, forced_tokens=forced_start(events) or request.forced_tokens), fingerprint)
        again, again_stats = rerun_alone(backend, alone, cancel)
        if cancel is not None and cancel.is_set():
            break  # a rerun cut short says nothing about the row
        verdict = replay_verdict(list(events), again, fingerprint, again_stats.fingerprint)
        audits.append(RowAudit(r, int(request.sampler.seed if request.sampler.seed is not None else again_stats.seed),
                               verdict))
    if progress is not None:
        progress(len(audits), len(rows))
    return LoomAudit(tuple(audits), asked=len(rows))


def audit_loom(backend: Backend, request: GenerationRequest, n: int, *, mode: str = "sample",
               cancel: threading.Event | None = None) -> LoomAudit:
    """Make `n` loom children of `request` as batched rows, then rerun each alone and compare (see module doc).

    Runs on the backend's worker thread.
    """
    from engine.fingerprints.taking import fingerprint_for
    from engine.loom.continuations import continuation_events, row_seeds

    if request.sampler.seed is None:
        raise ValueError("an audit needs the loom's seed: give the request's sampler a seed")
    seeds = row_seeds(request, n)
    events: list[list[TokenEvent]] = [[] for _ in range(n)]
    stats: list[GenerationStats | None] = [None] * n
    backend.trim_cache(0)
    for ev in continuation_events(backend, request, n, mode=mode, cancel=cancel):  # type: ignore[arg-type]  # a str: refused in words
        if isinstance(ev.event, Done):
            stats[ev.row] = ev.event.stats
        else:
            events[ev.row].append(ev.event)
    requests = [replace(request, sampler=request.sampler.with_(seed=seeds[r])) for r in range(n)]
    for r, st in enumerate(stats):  # the rows' record: as a single answer's, plus that they ran as a batch
        if st is not None and st.fingerprint is None:
            fp = fingerprint_for(backend, requests[r], st.seed, st)
            stats[r] = replace(st, fingerprint=replace(fp, extras={**fp.extras, "batch_rows": n}))
    rows = [(requests[r], events[r], st.fingerprint if st is not None else None) for r, st in enumerate(stats)]
    return audit_rows(backend, rows, cancel)
