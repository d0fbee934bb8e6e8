"""Several requests' answers decoded as rows of one batch: a server's clients sharing the model's forwards.

Where the model has batch runners (`engine.capabilities.BatchRunners`), answers that wait for the model at the
same time need not run one after another: every request's prompt is prefilled into the runner (llama.cpp: a
sequence each, no padding; torch and MLX: left-padded rows), a request with `n` > 1 has its prompt's row copied
n times (`reorder`), and then each step is one forward for every row still running (`decode_rows`). Each row
is the decode loop's own `AnswerRow` with its request's settings and seed, so its tokens and reports are made
exactly as the single-answer loop makes them; what can differ is the model's arithmetic in a batch, which each
row's fingerprint records (`extras["batch_rows"]`, for a replay's verdict).

Every request keeps its own cancel: a client that goes away ends its rows (finish "cancelled"), the others go on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.backends.base import Backend
from engine.capabilities import BatchRunners
from engine.decode import check_context, prompt_ids_for
from engine.decode_row import AnswerRow
from engine.events import Done
from engine.fingerprinting import row_with_fingerprint
from engine.loom.batch_loop import RowEvent, decode_rows
from engine.loom.continuations import row_seeds, runs_in_batch
from engine.request import GenerationRequest


@dataclass(frozen=True, eq=False)
class BatchJob:
    """One request in a shared batch: its `n` answers become `n` rows, seeded `seed + row` (as the loom's)."""

    request: GenerationRequest
    n: int = 1
    cancel: threading.Event = field(default_factory=threading.Event)


def cells_needed(prompt_tokens: int, job_n: int, max_new_tokens: int) -> int:
    """KV cache positions a request's rows can fill: its prompt once (shared by its rows), and each row's answer."""
    return prompt_tokens + job_n * max_new_tokens


def shared_batch_events(backend: Backend, jobs: Sequence[BatchJob]) -> Iterator[tuple[int, RowEvent]]:
    """(job index, RowEvent) for every row of every job; each job's rows are numbered 0..n-1 and end with Done.

    Runs on the backend's worker thread. Raises ValueError when a job cannot be a batch row (`runs_in_batch`),
    ContextLengthError when a prompt and its answer do not fit the model's context.
    """
    if not isinstance(backend, BatchRunners):
        raise ValueError(f"{backend.info.name} has no batch runner to share")
    for job in jobs:
        if not runs_in_batch(backend, job.request):
            raise ValueError("a request with banned strings, a structured output or steering runs alone, "
                             "through the decode loop")
    tok = backend.tokenizer
    t0 = time.perf_counter()
    prompts = [prompt_ids_for(tok, job.request) for job in jobs]
    for job, prompt in zip(jobs, prompts):
        check_context(len(prompt), job.request.max_new_tokens, backend.info.context_length)
    owner: list[tuple[int, int]] = []  # answer row -> (job, the job's row)
    rows: list[AnswerRow] = []
    for j, (job, prompt) in enumerate(zip(jobs, prompts)):
        for r, seed in enumerate(row_seeds(job.request, job.n)):
            owner.append((j, r))
            rows.append(AnswerRow.start(backend, job.request, prompt, t0, seed=seed))
    first_row = {j: owner.index((j, 0)) for j in range(len(jobs))}
    reused = [0] * len(jobs)  # per job: its prompt's tokens the runner did not compute for it (set at start)

    def done(i: int) -> RowEvent:
        j, _ = owner[i]
        # Each job's first row computed its prompt, less a beginning the runner shared or took from the
        # backend's cache; the job's other rows copy that row's prompt whole.
        stats = rows[i].stats(reused_tokens=reused[j] if first_row[j] == i else len(prompts[j]),
                              peak_memory_bytes=backend.peak_memory_bytes())
        return RowEvent(i, Done(stats))

    def stopped(i: int) -> bool:
        return jobs[owner[i][0]].cancel.is_set()

    def events() -> Iterator[RowEvent]:
        runner = backend.batch_runner()
        try:
            logits = runner.start(prompts)  # (jobs, V): every prompt once
            reused[:] = runner.reused_prompt_tokens
            expand = [j for j, _ in owner]
            if expand != list(range(len(jobs))):
                runner.reorder(expand)  # a job's n rows over its one prompt
                logits = logits[expand]
            yield from decode_rows(runner, rows, logits, force=lambda i, row: row.forced_here(), stopped=stopped,
                                   done=done)
        finally:
            runner.close()

    total = len(rows)

    def told(i: int, event: RowEvent) -> tuple[int, RowEvent]:
        """The event under its job's own row number; a Done with its fingerprint, marked as one of `total`
        rows decoded together (and of the job's n siblings)."""
        j, r = owner[i]
        extras: dict[str, Any] = {"batch_rows": total} if jobs[j].n == 1 else {"batch_rows": total,
                                                                                "loom_rows": jobs[j].n}
        return j, row_with_fingerprint(backend, jobs[j].request, RowEvent(r, event.event), extras)

    if all(job.cancel.is_set() for job in jobs):
        for i, row in enumerate(rows):
            row.end("cancelled")
            yield told(i, done(i))
        return
    for ev in events():
        yield told(ev.row, ev)
