"""Continuous batching: requests that join a shared batch while it decodes are each their own answers.

On the default model (llama.cpp: each row a sequence of its own, `LlamaCppRunner.admit`), jobs are offered to a
running batch's inbox between its steps: while the first rows decode, after a row has ended (its cells kept by
the runner's graveyard), and as the last row ends (the batch goes on with the newcomer rather than dropping
it). Every joined row must be what the single-answer loop makes for its request and seed, bit for bit, and the
rows already there must not change. A closed inbox refuses, and a runner that cannot admit never opens one.
"""

from __future__ import annotations

import pytest

from engine.events import Done, TokenEvent
from engine.decode.batch_inbox import BatchInbox
from engine.decode.shared_batch import BatchJob, shared_batch_events
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings
from test_shared_batch import JOBS, alone, ask, check_own_answers

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_jobs_that_join_a_running_batch_are_their_own_answers(fresh_default_llamacpp, monkeypatch):
    backend = fresh_default_llamacpp
    runners = []
    original = backend.batch_runner
    monkeypatch.setattr(backend, "batch_runner", lambda: runners.append(original()) or runners[-1])
    inbox: BatchInbox[BatchJob] = BatchInbox()
    jobs = [BatchJob(JOBS[1]), BatchJob(JOBS[2])]
    joining = [BatchJob(JOBS[0], n=2),  # while both first rows decode; n = 2: one prompt, two rows
               BatchJob(ask("Count from one to five.", sampler=SamplerSettings(temperature=0.7, seed=5),
                            max_new_tokens=10))]  # after the short answer has ended
    accepted = []
    tokens: dict[tuple[int, int], list[TokenEvent]] = {}
    stats = {}
    for j, ev in shared_batch_events(backend, jobs, inbox):
        if isinstance(ev.event, Done):
            stats[j, ev.row] = ev.event.stats
            if j == 1:
                accepted.append(inbox.offer(joining[1]))
        else:
            tokens.setdefault((j, ev.row), []).append(ev.event)
            if (j, len(tokens[j, ev.row])) == (0, 2):
                accepted.append(inbox.offer(joining[0]))
    assert accepted == [True, True]
    assert sorted(stats) == [(0, 0), (1, 0), (2, 0), (2, 1), (3, 0)]
    assert len(runners) == 1  # they joined the batch under way, not a batch of their own
    assert not inbox.is_open and not inbox.offer(BatchJob(JOBS[2]))  # the batch is over: a later offer waits
    everyone = jobs + joining
    check_own_answers(backend, everyone, tokens, stats)
    assert stats[2, 1].seed == stats[2, 0].seed + 1
    # The joined job's prompt was computed once for its two rows (the second copies the first's).
    assert stats[2, 0].reused_tokens == 0 and stats[2, 1].reused_tokens == stats[2, 1].prompt_tokens
    assert stats[3, 0].fingerprint is not None and stats[3, 0].fingerprint.extras["batch_rows"] == 5


def test_a_job_offered_as_the_last_row_ends_is_still_run(fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    inbox: BatchInbox[BatchJob] = BatchInbox()
    late = BatchJob(JOBS[2])
    stats = {}
    tokens: dict[tuple[int, int], list[TokenEvent]] = {}
    for j, ev in shared_batch_events(backend, [BatchJob(JOBS[1])], inbox):
        if isinstance(ev.event, Done):
            stats[j, ev.row] = ev.event.stats
            if j == 0:  # the batch's only row has ended: the batch has not closed yet, so this one is taken
                assert inbox.offer(late)
        else:
            tokens.setdefault((j, ev.row), []).append(ev.event)
    assert sorted(stats) == [(0, 0), (1, 0)]
    check_own_answers(backend, [BatchJob(JOBS[1]), late], tokens, stats)


def test_a_job_offered_before_the_batch_begins_joins_at_its_first_step(fresh_default_llamacpp):
    """The server makes the batch and offers newcomers at once, while the model's worker may still be busy
    or prefilling: they are taken at the first step."""
    backend = fresh_default_llamacpp
    inbox: BatchInbox[BatchJob] = BatchInbox()
    early = BatchJob(JOBS[2])
    assert inbox.offer(early)
    tokens: dict[tuple[int, int], list[TokenEvent]] = {}
    stats = {}
    for j, ev in shared_batch_events(backend, [BatchJob(JOBS[1])], inbox):
        if isinstance(ev.event, Done):
            stats[j, ev.row] = ev.event.stats
        else:
            tokens.setdefault((j, ev.row), []).append(ev.event)
    assert stats[1, 0].fingerprint.extras["batch_rows"] == 2  # a row of the same batch, not one after it
    assert tokens[1, 0][0].index == 0 and len(tokens[0, 0]) > len(tokens[1, 0])
    check_own_answers(backend, [BatchJob(JOBS[1]), early], tokens, stats)


def test_a_batch_stops_taking_newcomers_when_other_work_waits(fresh_default_llamacpp):
    inbox: BatchInbox[BatchJob] = BatchInbox()
    offers = []
    for _j, ev in shared_batch_events(fresh_default_llamacpp, [BatchJob(JOBS[1])], inbox, others_waiting=lambda: True):
        if isinstance(ev.event, TokenEvent) and ev.event.index == 3:
            offers.append(inbox.offer(BatchJob(JOBS[2])))  # the first step's take closed it: the window waits
    assert offers == [False]


def test_a_runner_that_cannot_admit_rows_runs_earlier_offers_after_its_batch(tiny_torch):
    """torch's left-padded rows cannot take a newcomer: the batch closes its inbox as it starts, and what was
    offered before (while the batch waited for the model) runs right after it, as a batch of its own."""
    inbox: BatchInbox[BatchJob] = BatchInbox()
    first = GenerationRequest(prompt="Hi", sampler=SamplerSettings(temperature=0.0), max_new_tokens=3)
    early = GenerationRequest(prompt="Hello there", sampler=SamplerSettings(temperature=0.0), max_new_tokens=2)
    assert inbox.offer(BatchJob(early))  # before the model's worker starts the batch
    events = []
    for j, ev in shared_batch_events(tiny_torch, [BatchJob(first)], inbox):
        events.append((j, ev))
        if j == 0 and isinstance(ev.event, TokenEvent):
            assert not inbox.offer(BatchJob(first))  # while the batch runs: refused, it waits its own turn
    done = {j: ev.event.stats for j, ev in events if isinstance(ev.event, Done)}
    assert sorted(done) == [0, 1] and [j for j, _ in events].index(1) > [j for j, _ in events].index(0)
    assert done[1].token_ids == alone(tiny_torch, early, done[1].seed)[1].token_ids
