"""Stage records the engine defers (engine.lazy_tuple) are stored after the answer, not while it streams.

While an answer streams, the chat flushes its tokens every 50 ms (`Conversation.flush(defer_stages=True)`): a
token whose records no one has read yet is written without them, so building them is not paid while the model
runs. Once it has ended they are built and written in slices (`Conversation.write_due_stages`), or all at once
by a plain `flush()`, and a restart reads them back as they were. A crash in between keeps every token.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.events import StageSnapshot, TokenEvent, TokenProb
from engine.lazy_tuple import LazyTuple

from app.controllers import chat as chat_module
from app.controllers.chat import ChatController
from app.state.conversation_list import Library
from app.state.settings import SettingsState

STAGES = (StageSnapshot("top_k", 40, 0.97, 2.5, (TokenProb(5, "a", -0.1),)),
          StageSnapshot("temperature", 40, 1.0, 2.9, (TokenProb(5, "a", -0.2),)))


def _event(i: int, built: list[int]) -> TokenEvent:
    def build(i=i):
        built.append(i)
        return STAGES

    return TokenEvent(index=i, token_id=5, text="a", token_text="a", logprob=-0.1, sampler_logprob=-0.2, rank=0,
                      entropy=2.5, top_model=(TokenProb(5, "a", -0.1),), top_sampler=(TokenProb(5, "a", -0.2),),
                      stages=LazyTuple(build))


def test_deferred_records_are_written_at_the_answers_end(store) -> None:
    conv = Library(store).new()
    question = conv.add_message(None, "user", "Write something.")
    answer = conv.add_message(question, "assistant")
    built: list[int] = []
    events = [_event(i, built) for i in range(3)]
    conv.append_tokens(answer, events[:2])
    assert conv.flush(defer_stages=True) == 2
    conv.append_tokens(answer, events[2:])
    assert conv.flush(defer_stages=True) == 1
    assert built == [] and conv.has_unsaved_tokens  # nothing built while streaming; the records still to write
    stored = store.tokens(answer.id)
    assert [t.index for t in stored] == [0, 1, 2] and all(t.stages is None for t in stored)  # a crash keeps these

    conv.flush()  # the answer's end
    assert sorted(built) == [0, 1, 2] and not conv.has_unsaved_tokens
    assert [t.stages for t in store.tokens(answer.id)] == [STAGES] * 3


def test_records_read_while_streaming_are_written_at_once(store) -> None:
    conv = Library(store).new()
    answer = conv.add_message(conv.add_message(None, "user", "Hi"), "assistant")
    built: list[int] = []
    event = _event(0, built)
    assert event.stages[0].stage == "top_k"  # the stage view opened on it: built now
    conv.append_tokens(answer, [event])
    conv.flush(defer_stages=True)
    assert built == [0] and not conv.has_unsaved_tokens
    assert store.tokens(answer.id)[0].stages == STAGES


def test_due_records_are_written_in_slices_in_order_and_a_failed_slice_keeps_them(store, monkeypatch) -> None:
    conv = Library(store).new()
    first = conv.add_message(conv.add_message(None, "user", "One"), "assistant")
    second = conv.add_message(conv.add_message(first, "user", "Two"), "assistant")
    built: list[int] = []
    conv.append_tokens(first, [_event(i, built) for i in range(3)])
    conv.append_tokens(second, [_event(i, built) for i in range(2)])
    conv.flush(defer_stages=True)
    assert conv.has_due_stages and built == []

    # No budget: one token a slice, the first answer's in order, then the second's.
    assert conv.write_due_stages(0.0) and built == [0]
    assert [t.stages for t in store.tokens(first.id)] == [STAGES, None, None]

    def broken(message_id, events):
        raise OSError("disk full")

    monkeypatch.setattr(store, "write_tokens", broken)
    with pytest.raises(OSError):
        conv.write_due_stages(0.0)
    monkeypatch.undo()
    assert conv.has_due_stages  # the token whose write failed is still due, first in line

    while conv.write_due_stages(10.0):  # a budget for all: the rest in one slice
        pass
    assert not conv.has_due_stages and not conv.has_unsaved_tokens and sorted(built) == [0, 0, 1, 1, 2]
    assert [t.stages for t in store.tokens(first.id)] == [STAGES] * 3
    assert [t.stages for t in store.tokens(second.id)] == [STAGES] * 2


def _none_stages(store, message_id: int) -> int:
    return sum(t.stages is None for t in store.tokens(message_id))


def _chat(store, host) -> tuple[Library, ChatController]:
    library, settings = Library(store), SettingsState(store)
    settings.set_max_new_tokens(24)
    return library, ChatController(library, settings, host)


def test_the_chat_writes_them_after_the_answer_and_waits_while_another_runs(store, host) -> None:
    """Through the chat controller on the mock model (its tokens go through the real sampler chain)."""
    library, chat = _chat(store, host)

    async def two_answers() -> tuple:
        assert await host.load("mock", "mock")
        first = await chat.send("the cat")
        conv = library.current
        left_at_end = _none_stages(store, first.id)  # the answer has ended; no slice has run yet
        second = await chat.send("the dog")  # the slices wait while it runs
        left_after_second = _none_stages(store, first.id)
        for _ in range(500):
            if not conv.has_due_stages:
                break
            await asyncio.sleep(0.01)
        return first, second, left_at_end, left_after_second

    first, second, left_at_end, left_after_second = asyncio.run(two_answers())
    assert left_at_end > 0 and left_after_second == left_at_end
    assert _none_stages(store, first.id) == 0 and _none_stages(store, second.id) == 0
    assert [t.stages for t in store.tokens(first.id)] == [t.stages for t in library.current.tokens(first)]


def test_a_loop_that_closes_first_writes_what_is_left_at_once(store, host, monkeypatch) -> None:
    monkeypatch.setattr(chat_module, "STAGE_SLICE_S", 0.0)  # a token a slice: the loop closes with most still due
    _, chat = _chat(store, host)

    async def one_answer():
        assert await host.load("mock", "mock")
        return await chat.send("the cat")

    answer = asyncio.run(one_answer())  # asyncio.run's end cancels the slices, which then write all at once
    assert len(store.tokens(answer.id)) == 24 and _none_stages(store, answer.id) == 0
