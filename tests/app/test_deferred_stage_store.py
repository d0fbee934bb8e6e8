"""Stage records the engine defers (engine.lazy_tuple) are stored at the answer's end, not while it streams.

While an answer streams, the chat flushes its tokens every 50 ms (`Conversation.flush(defer_stages=True)`): a
token whose records no one has read yet is written without them, so building them is not paid while the model
runs; the answer's last flush writes them, built then, and a restart reads them back as they were. A crash in
between keeps every token.
"""

from __future__ import annotations

from engine.events import StageSnapshot, TokenEvent, TokenProb
from engine.lazy_tuple import LazyTuple

from app.state.conversation_list import Library

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
