"""Token records keep each stage's note ("top N from server") through the database; old records still load."""

from __future__ import annotations

import json
import math

from dataclasses import replace

from engine import Rewind, StageSnapshot, TokenEvent, TokenProb

from app.state.database.records import alternatives_json, token_from_row, token_row
from app.state.database.store import Store

NOTE = "top 20 from server, renormalised over them"


def _event(index: int, notes: tuple[str, str]) -> TokenEvent:
    top = (TokenProb(5, " cat", math.log(0.6)), TokenProb(9, " dog", math.log(0.3)))
    stages = (
        StageSnapshot("top_k", 2, 0.9, 0.64, top, note=notes[0]),
        StageSnapshot("temperature", 2, 1.0, 0.61, top[:1], note=notes[1]),
    )
    return TokenEvent(index=index, token_id=5, text=" cat", token_text=" cat", logprob=math.log(0.6),
                      sampler_logprob=math.log(0.66), rank=0, entropy=0.8, top_model=top, top_sampler=top[:1],
                      stages=stages)


def test_stage_notes_survive_the_database_and_a_reopen(tmp_path):
    path = tmp_path / "notes.sqlite3"
    events = [_event(0, (NOTE, NOTE)), _event(1, ("", "sampled by the server"))]
    store = Store(path)
    conv = store.create_conversation("remote")
    user = store.insert_message(conv.id, None, "user", "hi")
    answer = store.insert_message(conv.id, user.id, "assistant")
    store.write_tokens(answer.id, events)
    store.close()

    reopened = Store(path)
    try:
        loaded = reopened.tokens(answer.id)
    finally:
        reopened.close()
    assert loaded == events
    assert [s.note for s in loaded[0].stages] == [NOTE, NOTE]
    assert [s.note for s in loaded[1].stages] == ["", "sampled by the server"]


def test_records_without_notes_load_and_stay_small():
    ev = _event(0, ("", ""))
    doc = json.loads(alternatives_json(ev))
    assert all(len(stage) == 5 for stage in doc["st"])  # no note field written for a local model's stages
    # A record written before notes existed (five fields per stage) loads with empty notes.
    old = token_row(1, ev)[1:]
    loaded = token_from_row(old)
    assert loaded == ev and all(s.note == "" for s in loaded.stages)
    noted = token_from_row(token_row(1, _event(0, (NOTE, "")))[1:])
    assert [s.note for s in noted.stages] == [NOTE, ""]


def test_a_banned_string_step_back_survives_the_database(tmp_path):
    """The inspector's "banned 'X' here" comes from the record's Rewind: it must outlive a restart."""
    path = tmp_path / "rewind.sqlite3"
    stepped = replace(_event(1, ("", "")), rewind=Rewind(" a tapestry", 2, 264, " a"))
    store = Store(path)
    conv = store.create_conversation("bans")
    user = store.insert_message(conv.id, None, "user", "hi")
    answer = store.insert_message(conv.id, user.id, "assistant")
    store.write_tokens(answer.id, [_event(0, ("", "")), stepped])
    store.close()
    reopened = Store(path)
    try:
        loaded = reopened.tokens(answer.id)
    finally:
        reopened.close()
    assert loaded[0].rewind is None
    assert loaded[1].rewind == Rewind(" a tapestry", 2, 264, " a")
