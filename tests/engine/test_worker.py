"""The worker thread: cancel before the next token, errors reach the caller, asyncio streaming."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.engine import Engine
from engine.errors import TokenIdError
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

SAMPLE = SamplerSettings(temperature=1.0, seed=0)


@pytest.fixture
def tiny_engine(tiny_torch):
    eng = Engine.from_backend(tiny_torch)
    yield eng
    eng.close()


def test_cancel_takes_effect_before_the_next_token(tiny_engine):
    seen: list = []
    first = threading.Event()

    def on_event(event):
        seen.append(event)
        if isinstance(event, TokenEvent) and event.index == 0:
            handle.cancel()
            first.set()

    handle = tiny_engine.submit(GenerationRequest(prompt="go", sampler=SAMPLE, max_new_tokens=300), on_event)
    stats = handle.result.result(timeout=60)
    assert stats.finish_reason == "cancelled"
    assert stats.generated_tokens == 1 and len([e for e in seen if isinstance(e, TokenEvent)]) == 1


def test_worker_exception_reaches_the_caller_and_worker_survives(tiny_engine):
    bad = GenerationRequest(prompt_ids=(10**7,), sampler=SAMPLE, max_new_tokens=4)  # id beyond the vocabulary
    # The vocabulary check raises in the worker; the error travels to the caller as a value and is re-raised here.
    with pytest.raises(TokenIdError, match="outside this model's vocabulary"):
        list(tiny_engine.generate(bad))
    ok = tiny_engine.complete(GenerationRequest(prompt="still alive", sampler=SAMPLE, max_new_tokens=3))
    assert ok.generated_tokens == 3


def test_async_stream_yields_tokens_then_done(tiny_engine):
    async def collect():
        return [e async for e in tiny_engine.stream(GenerationRequest(prompt="async", sampler=SAMPLE, max_new_tokens=5))]

    events = asyncio.run(collect())
    assert [type(e) for e in events] == [TokenEvent] * 5 + [Done]


def test_leaving_the_async_loop_early_cancels(tiny_engine):
    async def first_then_break():
        agen = tiny_engine.stream(GenerationRequest(prompt="early", sampler=SAMPLE, max_new_tokens=400))
        async for event in agen:
            break
        await agen.aclose()

    asyncio.run(first_then_break())
    # The worker is free again quickly: a new request completes (it would queue behind 400 tokens otherwise).
    stats = tiny_engine.complete(GenerationRequest(prompt="next", sampler=SAMPLE, max_new_tokens=2))
    assert stats.generated_tokens == 2


def test_load_errors_surface_from_engine_load():
    from engine.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError):
        Engine.load("/definitely/not/here")
