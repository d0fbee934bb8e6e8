"""Exact replays (issue 43 item 1): an answer records the forward calls its prompt's cache was computed in, and a
replay computes its prompt in the same pieces, so it repeats bit for bit even when the original's start came from
an earlier turn's cache. On llama.cpp's CPU a batch's size changes the numbers (SmolLM2 with flash attention:
batches of 64 tokens or more give other bits than smaller ones), which is why a chat's second answer replayed with
its prompt computed whole "diverged" with no recorded difference."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.cache_schedule import CacheSchedule, check_record, covers, describe, from_record, reusable, to_record
from engine.events import Done
from engine.experiments.audit import audit_rows
from engine.experiments.replay import as_recorded, replay_verdict
from engine.fingerprints.record import Fingerprint
from engine.fingerprints.taking import rows_with_fingerprint, with_fingerprint
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings


def test_a_schedule_follows_the_cache_it_describes():
    s = CacheSchedule()
    s.ran(34)
    for _ in range(13):
        s.ran(1)
    s.ran(23)
    assert len(s) == 70 and s.upto(70) == ((34, 34),) + ((1, 1),) * 13 + ((23, 23),)
    s.trim(69)  # a prompt asked again: its last token is run anew
    assert s.upto(69)[-1] == (23, 22) and len(s) == 69
    s.trim(20)
    assert s.upto(100) == ((34, 20),)
    assert describe(to_record(((34, 34),) + ((1, 1),) * 13 + ((23, 22),))) == "34 + 13×1 + 22 of 23"
    record = to_record(s.upto(20))
    assert from_record(record) == ((34, 20),) and covers(from_record(record), 20) and not covers(((3, 3),), 4)
    assert reusable(((5, 5), (1, 1), (4, 4)), ((5, 5), (1, 1), (2, 2))) == 6


@pytest.mark.parametrize("record", ["x", [[1, 2, 1]], [[0, 0, 1]], [[1, 1, True]], [[2, 1]], [[1, 1, 1 << 30]],
                                    [[1 << 20, 1 << 20, 2]], [[1, 1, 1]] * 5000])
def test_a_hostile_stored_schedule_is_refused_in_words_without_being_expanded(record):
    with pytest.raises(ValueError, match="cache schedule"):
        check_record(record)
    d = Fingerprint("m", "", "", "llamacpp", "cpu", (), (), 1).to_dict()
    with pytest.raises(ValueError, match="cache_schedule"):
        Fingerprint.from_dict({**d, "cache_schedule": record})


def _run(backend, request):
    from engine.decode.loop import generate_events
    import threading

    events, stats = [], None
    for ev in with_fingerprint(backend, request, generate_events(backend, request, threading.Event())):
        if isinstance(ev, Done):
            stats = ev.stats
        else:
            events.append(ev)
    return events, stats


def _disturb(backend):
    backend.trim_cache(0)
    _run(backend, GenerationRequest(prompt="Something else entirely.", max_new_tokens=2,
                                    sampler=SamplerSettings(temperature=0)))


def _second_turn(backend):
    """A chat's second answer, its prompt's start taken from the first answer's cache (as the window's chat does)."""
    sampler = SamplerSettings(temperature=1.0, seed=7)
    backend.trim_cache(0)
    first = ({"role": "user", "content": "Name three colours, then say which one you like best and why."},)
    _, stats1 = _run(backend, GenerationRequest(messages=first, sampler=sampler, max_new_tokens=24))
    second = first + ({"role": "assistant", "content": stats1.text},
                      {"role": "user", "content": "Now write a two-line poem about the second colour you named."})
    request = GenerationRequest(messages=second, sampler=sampler, max_new_tokens=24)
    events, stats = _run(backend, request)
    return request, events, stats


@pytest.mark.slow
def test_a_replay_computes_its_prompt_as_the_original_did_and_repeats_bit_for_bit(fresh_default_llamacpp):
    backend = fresh_default_llamacpp
    request, original, stats = _second_turn(backend)
    fp = stats.fingerprint
    assert stats.reused_tokens > 0 and len(fp.cache_schedule) > 1, "the second turn reuses the first's cache"
    assert fp.prompt_sha256 == stats.prompt_sha256 and len(fp.prompt_sha256) == 64

    _disturb(backend)  # the cache now holds something else, as when a replay is asked for later
    plain, plain_stats = _run(backend, request)
    plain_verdict = replay_verdict(original, plain, fp, plain_stats.fingerprint)
    # Computed whole, the prompt's cache has other pieces; when the numbers moved, the record says that is why.
    assert any(c.startswith("prompt cache computed in other pieces") for c in plain_verdict.fingerprint_changes)

    _disturb(backend)
    exact, exact_stats = _run(backend, as_recorded(request, fp))
    verdict = replay_verdict(original, exact, fp, exact_stats.fingerprint)
    assert verdict.identical, verdict.describe()
    assert exact_stats.fingerprint.cache_schedule == fp.cache_schedule

    # From a warm cache (the replay's own), only pieces computed the same way are reused, and it still repeats.
    again, again_stats = _run(backend, as_recorded(request, fp))
    assert again_stats.reused_tokens > 0
    assert replay_verdict(original, again, fp, again_stats.fingerprint).identical


@pytest.mark.slow
def test_a_regenerated_answer_whose_prompt_piece_was_cut_replays_exactly(fresh_default_llamacpp):
    """Asking the same prompt again cuts its last token and runs it anew: the first piece is kept short of what it
    computed ("30 of 31"); the replay computes that piece whole and cuts it the same way."""
    backend = fresh_default_llamacpp
    request = GenerationRequest(messages=({"role": "user", "content": "Tell me about the sea in one sentence."},),
                                sampler=SamplerSettings(temperature=1.0, seed=11), max_new_tokens=12)
    backend.trim_cache(0)
    _run(backend, request)
    original, stats = _run(backend, replace(request, sampler=request.sampler.with_(seed=12)))
    pieces = from_record(stats.fingerprint.cache_schedule)
    assert pieces[0][0] > pieces[0][1] and pieces[-1] == (1, 1), pieces
    _disturb(backend)
    again, again_stats = _run(backend, as_recorded(replace(request, sampler=request.sampler.with_(seed=12)),
                                                   stats.fingerprint))
    assert replay_verdict(original, again, stats.fingerprint, again_stats.fingerprint).identical


@pytest.mark.slow
def test_loom_rows_begun_from_the_chats_cache_audit_to_exactly_zero(fresh_default_llamacpp):
    """The window's loom starts from the chat's cache; the audit reruns each row with its prompt computed in the
    row's pieces (14 of 16 rows 'diverged' when it computed the prompt whole)."""
    import threading

    from engine.loom.continuations import continuation_events

    backend = fresh_default_llamacpp
    request, _, _ = _second_turn(backend)  # the chat's cache now holds this prompt's start
    loom = replace(request, sampler=SamplerSettings(temperature=1.0, seed=21), max_new_tokens=12)
    rows: dict[int, list] = {0: [], 1: [], 2: []}
    fps: dict[int, Fingerprint] = {}
    for ev in rows_with_fingerprint(backend, loom, 3, continuation_events(backend, loom, 3, cancel=threading.Event())):
        if isinstance(ev.event, Done):
            fps[ev.row] = ev.event.stats.fingerprint
        else:
            rows[ev.row].append(ev.event)
    assert all(len(fps[r].cache_schedule) > 1 for r in rows), "the rows' prompt began from the chat's cache"
    seeds = [21, 22, 23]
    audit = audit_rows(backend, [(replace(loom, sampler=loom.sampler.with_(seed=seeds[r])), rows[r], fps[r])
                                 for r in rows])
    assert audit.all_identical and audit.max_logprob_diff == 0.0, audit.lines()
