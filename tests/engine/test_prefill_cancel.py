"""A cancel during a long prompt on llama.cpp stops within milliseconds, inside a chunk, and the cache stays right.

llama.cpp runs a prompt chunk (512 tokens) in one `llama_decode`; before the
abort callback (engine/backends/llamacpp/abort.py) a cancel waited for the
chunk to end: 0.24-3.68 s.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("llama_cpp")

import llama_cpp  # noqa: E402

from engine.backend import prefill  # noqa: E402
from engine.backends.llamacpp import abort, native  # noqa: E402
from engine.decode.loop import generate_events  # noqa: E402
from engine.events import Done, TokenEvent  # noqa: E402
from engine.request import GenerationRequest  # noqa: E402
from engine.sampling import SamplerSettings  # noqa: E402

GREEDY = SamplerSettings(temperature=0)
TEXT = "The lighthouse keeper wrote every night about the ships, the weather and the gulls. "


def long_prompt(backend, n: int) -> list[int]:
    ids = backend.tokenizer.encode(TEXT)
    return (ids * (n // len(ids) + 1))[:n]


def greedy_run(backend, ids: list[int], cancel: threading.Event | None = None) -> Done:
    req = GenerationRequest(prompt_ids=ids, sampler=GREEDY, max_new_tokens=8, ignore_eos=True, top_n=0)
    events = list(generate_events(backend, req, cancel))
    assert isinstance(events[-1], Done)
    return events[-1]


@pytest.fixture(params=["C strlen", "Python callback"])
def abortable_default(request, fresh_default_llamacpp, monkeypatch):
    """The default model with its abort callback as loaded (libc's strlen) or as the fallback where none is found."""
    backend = fresh_default_llamacpp
    if request.param == "Python callback":
        monkeypatch.setattr(abort, "_c_strlen", lambda: None)
        backend._abort = abort.AbortSwitch(backend.ctx)
    yield backend
    backend._abort = abort.AbortSwitch(backend.ctx)


@pytest.mark.slow
@pytest.mark.model
def test_a_cancel_stops_inside_a_prompt_chunk_and_the_cache_stays_consistent(abortable_default):
    backend = abortable_default
    ids = long_prompt(backend, 2 * backend.n_batch + 16)
    start = backend.tokens_evaluated
    asked_at: list[float] = []

    def cancelled() -> bool:  # true once the first llama_decode (n_batch tokens) is done: the second is running
        if backend.tokens_evaluated - start >= backend.n_batch:
            asked_at.append(time.perf_counter())
            return True
        return False

    # One chunk of the whole prompt: without a stop inside llama_decode, all three decodes run.
    logits, reused = prefill(backend, ids, chunk=len(ids), cancelled=cancelled)
    assert logits is None and reused == 0, "the whole prompt ran despite the cancel"
    latency = time.perf_counter() - asked_at[0]
    assert latency < 0.5, f"the prompt stopped {latency:.2f} s after the cancel"
    assert list(backend.cached_tokens()) == ids[: backend.n_batch]  # the decode that finished, not the stopped one
    assert llama_cpp.llama_memory_seq_pos_max(backend._memory, 0) == backend.n_batch - 1  # llama.cpp agrees
    assert native.take_recent_errors() == ""  # the abort's log lines are not kept as errors

    resumed = greedy_run(backend, ids)
    assert resumed.stats.reused_tokens == backend.n_batch
    assert resumed.stats.token_ids == uncancelled_tokens(backend, ids)


# The uncancelled run of the same prompt on the same (session-wide) model, computed once for both abort
# callbacks: it never goes through an abort, so the callback cannot change it, and it is the half of each case's
# prompt work (the whole 2 * n_batch + 16 tokens) that the two would otherwise repeat.
_UNCANCELLED: dict[tuple[int, ...], tuple[int, ...]] = {}


def uncancelled_tokens(backend, ids: list[int]) -> tuple[int, ...]:
    if tuple(ids) not in _UNCANCELLED:
        backend.trim_cache(0)
        uncancelled = greedy_run(backend, ids)
        assert uncancelled.stats.reused_tokens == 0
        _UNCANCELLED[tuple(ids)] = tuple(uncancelled.stats.token_ids)
    return _UNCANCELLED[tuple(ids)]


@pytest.mark.slow
@pytest.mark.model
def test_cancelling_a_generation_during_its_prompt_returns_within_half_a_second(fresh_default_llamacpp):
    """The app's path: the worker runs `generate_events`, the window sets the cancel event."""
    backend = fresh_default_llamacpp
    ids = long_prompt(backend, 4 * backend.n_batch)
    start = backend.tokens_evaluated
    cancel = threading.Event()
    events: list = []
    worker = threading.Thread(target=lambda: events.extend(generate_events(
        backend, GenerationRequest(prompt_ids=ids, sampler=GREEDY, max_new_tokens=8), cancel)))
    worker.start()
    while backend.tokens_evaluated - start < backend.n_batch and worker.is_alive():
        time.sleep(0.005)
    time.sleep(0.05)  # into the second chunk
    asked = time.perf_counter()
    cancel.set()
    worker.join(timeout=30)
    latency = time.perf_counter() - asked
    assert not worker.is_alive()
    assert latency < 0.5, f"the generation ended {latency:.2f} s after the cancel"
    assert not any(isinstance(e, TokenEvent) for e in events)
    assert events[-1].stats.finish_reason == "cancelled"
    assert len(backend.cached_tokens()) <= len(ids) // 2
