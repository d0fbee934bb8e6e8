"""Several requests' answers decoded as rows of one batch: a server's clients sharing the model's forwards.

Where the model has batch runners (`engine.capabilities.BatchRunners`), answers that wait for the model at the
same time need not run one after another: every request's prompt is prefilled into the runner (llama.cpp: a
sequence each, no padding; torch and MLX: left-padded rows), a request with `n` > 1 has its prompt's row copied
n times (`reorder`), and then each step is one forward for every row still running (`decode_rows`). Each row
is the decode loop's own `AnswerRow` with its request's settings and seed, so its tokens and reports are made
exactly as the single-answer loop makes them; what can differ is the model's arithmetic in a batch, which each
row's fingerprint records (`extras["batch_rows"]`, for a replay's verdict).

Every request keeps its own cancel: a client that goes away ends its rows (finish "cancelled"), the others go on.

Requests can also join while the batch runs (continuous batching), where the runner admits rows
(`engine.capabilities.AdmitsRows`: llama.cpp's, whose rows are sequences of their own): they are offered to the
batch's `BatchInbox`, and between two steps the batch prefills them as new rows and goes on with them. It stops
taking newcomers when no row goes on, or when other work waits for the model (`others_waiting`: the window's own
chat), so nothing waits behind a batch that never ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.backend import Backend
from engine.capabilities import AdmitsRows, BatchRunner, BatchRunners
from engine.decode.loop import check_context, prompt_ids_for
from engine.decode.row import AnswerRow
from engine.events import Done
from engine.fingerprints.taking import row_with_fingerprint
from engine.decode.batch_inbox import BatchInbox
from engine.decode.batch_loop import RowEvent, decode_rows
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


def shared_batch_events(backend: Backend, jobs: Sequence[BatchJob], inbox: BatchInbox[BatchJob] | None = None,
                        others_waiting: Callable[[], bool] | None = None) -> Iterator[tuple[int, RowEvent]]:
    """(job index, RowEvent) for every row of every job; each job's rows are numbered 0..n-1 and end with Done.

    `inbox`: where more jobs join while the batch runs (`BatchInbox`: taken between steps where the runner admits
    rows, closed when no row goes on or when `others_waiting()` says other work waits for the model; where the
    runner cannot admit rows, closed as the batch starts, and what was offered before runs right after it). A
    joined job's index follows the others', in the order it was offered.

    Runs on the backend's worker thread. Raises ValueError when a job cannot be a batch row (`runs_in_batch`),
    ContextLengthError when a prompt and its answer do not fit the model's context.
    """
    if not isinstance(backend, BatchRunners):
        raise ValueError(f"{backend.info.name} has no batch runner to share")
    batch = _SharedBatch(backend, list(jobs), inbox, others_waiting)
    try:
        if all(job.cancel.is_set() for job in batch.jobs):
            for i, row in enumerate(batch.rows):
                row.end("cancelled")
                yield batch.told(i, batch.done(i))
        else:
            for ev in batch.events():
                yield batch.told(ev.row, ev)
        # An accepted offer is never dropped: those the batch did not admit (its runner cannot, or it never
        # began) run now, as a batch of their own, numbered after the others.
        late = inbox.take(close=True) if inbox is not None else []
        if late:
            offset = len(batch.jobs)
            batch.jobs.extend(late)
            for j, ev in shared_batch_events(backend, late):
                yield offset + j, ev
    finally:
        if inbox is not None:
            inbox.take(close=True)  # on an error too: later offers wait for their own turn


class _SharedBatch:
    """The rows of one shared batch and whose they are: each job's prompt, its answer rows (`owner`: answer row
    -> (job, the job's row)), and what the runner reused of each prompt. Jobs that join are appended."""

    def __init__(self, backend: Backend, jobs: list[BatchJob], inbox: BatchInbox[BatchJob] | None,
                 others_waiting: Callable[[], bool] | None) -> None:
        assert isinstance(backend, BatchRunners)
        self.backend: Backend = backend
        self.jobs = jobs
        self.inbox = inbox
        self.others_waiting = others_waiting
        self.prompts: list[list[int]] = []
        self.owner: list[tuple[int, int]] = []
        self.rows: list[AnswerRow] = []
        self.first_row: dict[int, int] = {}  # job -> its first answer row
        self.reused: list[int] = []  # per job: its prompt's tokens the runner did not compute for it (set at start)
        self.add_rows(jobs, time.perf_counter())

    def add_rows(self, job_list: Sequence[BatchJob], since: float) -> list[list[int]]:
        """Each job's prompt and answer rows (checked first: nothing is added when one cannot run here)."""
        backend = self.backend
        for job in job_list:
            if not runs_in_batch(backend, job.request):
                raise ValueError("a request with banned strings, a structured output or steering runs alone, "
                                 "through the decode loop")
        new = [prompt_ids_for(backend.tokenizer, job.request) for job in job_list]
        for job, prompt in zip(job_list, new):
            check_context(len(prompt), job.request.max_new_tokens, backend.info.context_length)
        for job, prompt in zip(job_list, new):
            j = len(self.prompts)
            self.prompts.append(prompt)
            self.reused.append(0)
            self.first_row[j] = len(self.rows)
            for r, seed in enumerate(row_seeds(job.request, job.n)):
                self.owner.append((j, r))
                self.rows.append(AnswerRow.start(backend, job.request, prompt, since, seed=seed))
        return new

    def done(self, i: int) -> RowEvent:
        j, _ = self.owner[i]
        # Each job's first row computed its prompt, less a beginning the runner shared or took from the
        # backend's cache; the job's other rows copy that row's prompt whole.
        reused = self.reused[j] if self.first_row[j] == i else len(self.prompts[j])
        stats = self.rows[i].stats(reused_tokens=reused, peak_memory_bytes=self.backend.peak_memory_bytes())
        return RowEvent(i, Done(stats))

    def stopped(self, i: int) -> bool:
        return self.jobs[self.owner[i][0]].cancel.is_set()

    def admit(self, runner: BatchRunner, held: int) -> Any:
        """Between steps (decode_rows' `admit`): the jobs offered since the last call become rows after the
        `held` ones, each job's prompt prefilled once and copied to its n rows; None when nobody joined."""
        assert self.inbox is not None
        newcomers = self.inbox.take(close=not held or (self.others_waiting is not None and self.others_waiting()))
        if not newcomers:
            return None
        assert isinstance(runner, AdmitsRows)  # only such a runner is given this hook
        first_job = len(self.jobs)
        self.jobs.extend(newcomers)
        logits = runner.admit(self.add_rows(newcomers, time.perf_counter()))  # one row per job
        expand = [j - first_job for j, _ in self.owner[len(self.owner) - sum(job.n for job in newcomers):]]
        if expand != list(range(len(newcomers))):
            runner.reorder(list(range(held)) + [held + k for k in expand])  # a job's n rows over its one prompt
            logits = logits[expand]
        return logits

    def events(self) -> Iterator[RowEvent]:
        assert isinstance(self.backend, BatchRunners)
        runner = self.backend.batch_runner()
        try:
            logits = runner.start(self.prompts)  # (jobs, V): every prompt once
            self.reused[:] = runner.reused_prompt_tokens
            expand = [j for j, _ in self.owner]
            if expand != list(range(len(self.jobs))):
                runner.reorder(expand)  # a job's n rows over its one prompt
                logits = logits[expand]
            joins = None
            if self.inbox is not None and isinstance(runner, AdmitsRows):
                joins = lambda held: self.admit(runner, held)  # noqa: E731
            elif self.inbox is not None:
                self.inbox.close()  # no newcomers from now on; those offered so far run after this batch
            yield from decode_rows(runner, self.rows, logits, force=lambda i, row: row.forced_here(),
                                   stopped=self.stopped, done=self.done, admit=joins)
        finally:
            runner.close()

    def told(self, i: int, event: RowEvent) -> tuple[int, RowEvent]:
        """The event under its job's own row number; a Done with its fingerprint, marked as one of the rows
        decoded together so far (and of the job's n siblings)."""
        j, r = self.owner[i]
        extras: dict[str, Any] = {"batch_rows": len(self.rows)}
        if self.jobs[j].n > 1:
            extras["loom_rows"] = self.jobs[j].n
        return j, row_with_fingerprint(self.backend, self.jobs[j].request, RowEvent(r, event.event), extras)
