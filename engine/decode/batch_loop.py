"""The batched decode loop: answer rows (`AnswerRow`) stepping together through one batch runner.

Shared by the loom's N children of one prefix (`engine.loom.continuations`) and by a server's batch of several
clients' requests (`engine.decode.shared_batch`). The caller has started the runner so that batch row i holds
answer row i, and passes those rows' first logits; every step then takes each live row's token, runs one
forward for the rows that go on, and drops the rows that ended (another `reorder`), so later steps compute
only live rows. A row whose `stopped(row)` says so (its client went away, the window's Stop) ends "cancelled"
after the token it took, and leaves the batch; the others go on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import wait
from dataclasses import dataclass

import numpy as np

from engine.capabilities import BackgroundStep, BatchRunner
from engine.decode.row import AnswerRow, Taken
from engine.events import Event


@dataclass(frozen=True, slots=True)
class RowEvent:
    """One event of one row: `row` in 0..N-1; `event` a TokenEvent (index among the row's new tokens) or Done."""

    row: int
    event: Event


def _take_tokens(rows: list[AnswerRow], live: list[int], logits: np.ndarray,
                 force: Callable[[int, AnswerRow], int | None]) -> tuple[list[tuple[int, Taken]], list[int]]:
    """Each live row's next token, taken: ([(answer row, what it took)], the batch rows that have not ended)."""
    shown: list[tuple[int, Taken]] = []
    unfinished: list[int] = []
    for i, r in enumerate(live):
        row = rows[r]
        taken = row.take(row.choose(logits[i], force(r, row)), logits[i])
        assert taken is not None and taken.step_back is None  # rows that step back or are refused run elsewhere
        shown.append((r, taken))
        if not taken.ends:
            unfinished.append(i)
    return shown, unfinished


def decode_rows(
    runner: BatchRunner,
    rows: list[AnswerRow],
    logits: np.ndarray,
    *,
    force: Callable[[int, AnswerRow], int | None],
    stopped: Callable[[int], bool],
    done: Callable[[int], RowEvent],
    admit: Callable[[int], np.ndarray | None] | None = None,
) -> Iterator[RowEvent]:
    """Run every row to its end; yields each row's TokenEvents, then its `done(row)`.

    `admit(held)`, where given, is called between steps, when the runner holds exactly the `held` rows that go
    on: it may append answer rows to `rows` after having the runner admit their prompts (`AdmitsRows`), and
    returns their (k, V) first logits (None: nobody joined). With `held` 0 what it admits is all that keeps
    the batch going; when it admits nothing then, the loop ends.

    `logits` is (len(rows), V), row i's next-token logits; `force(row, answer_row)` is the token a row must take
    at its current step (None: its sampler chooses). Rows that could step back (banned strings) or be refused
    (a constraint) cannot run here: they need the decode loop.
    """
    live = list(range(len(rows)))  # batch row i is answer row live[i]
    while live:
        # Every row's token first (the next forward needs them all), then the next forward starts, and the
        # tokens' reports (stage snapshots, top-N, entropy) are built while it runs where the runner can step
        # on a helper thread (BackgroundStep), as the decode loop overlaps them (OverlappedForward).
        shown, unfinished = _take_tokens(rows, live, logits, force)
        going = [i for i in unfinished if not stopped(live[i])]
        tokens = [shown[i][1].token_id for i in going]
        pending = None
        if going:
            if len(going) < len(live):
                runner.reorder(going)  # drop the rows that ended or stopped
            if isinstance(runner, BackgroundStep):
                pending = runner.step_in_background(tokens)
        try:
            for r, taken in shown:
                yield RowEvent(r, rows[r].event(taken))
                if taken.ends:
                    yield done(r)
            for i in unfinished:
                if i not in going:
                    rows[live[i]].end("cancelled")
                    yield done(live[i])
        finally:
            if pending is not None and not pending.done():
                wait([pending])  # the runner is the step's until it returns (a consumer that stopped reading)
        live = [live[i] for i in going]
        # Rows stopped while this step's reports were read take no further token (as the decode loop checks
        # its cancel before each token).
        late = [j for j, r in enumerate(live) if stopped(r)]
        keep = [j for j in range(len(live)) if j not in late]
        for j in late:
            rows[live[j]].end("cancelled")
            yield done(live[j])
        if pending is not None:
            logits = pending.result()  # (len(live), V): one forward for every live row
            if late and keep:
                runner.reorder(keep)
                logits = logits[keep]
        elif keep:
            if late:
                runner.reorder(keep)
            logits = runner.step([tokens[j] for j in keep])
        live = [live[j] for j in keep]
        if admit is not None:
            # Between steps, with no forward under way: newcomers join (the runner's rows are the live ones;
            # with none left, it is emptied first).
            if not live:
                runner.reorder([])
            before, going_on = len(rows), len(live)
            fresh = admit(going_on)
            if fresh is not None and len(rows) > before:
                live += range(before, len(rows))
                logits = np.concatenate([logits, fresh]) if going_on else fresh
