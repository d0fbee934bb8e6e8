"""An answer's fingerprint in loom files and the database (issue 35 item 4): exported and imported whole; a hostile
one refused in one line; an old answer without one, or a stored one that will not read, still loads."""

from __future__ import annotations

import copy
import json
import math
import sqlite3

import pytest
from loom_corpus import good_loom

from app.state.conversation_list import Library
from app.state.loom_import import LoomImportError, import_loom_file
from app.state.loom_tree import answer_group, export_tree
from app.state.database.store import Store
from engine.fingerprints.record import Fingerprint

FP = Fingerprint("SmolLM2-135M-Instruct", "b" * 64, "", "llamacpp", "cpu", (("llama-cpp-python", "0.3.36"),),
                 (("n_threads", 2), ("n_batch", 512), ("flash_attn", "auto")), 7, {"temperature": 0.7, "seed": 7},
                 {"steering": {"layer": 4, "scale": 1.5}}).to_dict()


def loom_with(fingerprint) -> dict:
    doc = copy.deepcopy(good_loom())
    doc["answers"][0]["stats"]["fingerprint"] = fingerprint
    return doc


@pytest.fixture
def library(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    yield Library(store)
    store.close()


def test_a_fingerprint_travels_through_a_loom_file_and_the_database(tmp_path, library):
    path = tmp_path / "loom.json"
    path.write_text(json.dumps(loom_with(FP)), encoding="utf-8")
    conv, question = import_loom_file(library, path)
    _, answers = answer_group(conv, question)
    assert Fingerprint.from_dict(answers[0].stats["fingerprint"]) == Fingerprint.from_dict(FP)
    assert "fingerprint" not in answers[1].stats  # an answer from before fingerprints imports as it is
    reopened = Library(Store(library.store.path))
    try:
        again = reopened.open(conv.id)
        stored = [m for m in again.messages.values() if m.stats and "fingerprint" in m.stats]
        assert len(stored) == 1 and stored[0].stats["fingerprint"] == FP and stored[0].unreadable is None
        # ... and it is exported again as it came in.
        out = export_tree(again, again.messages[question.id])
        assert sum("fingerprint" in (a.get("stats") or {}) for a in out["answers"]) == 1
    finally:
        reopened.store.close()


HOSTILE = {
    "a list": [1, 2],
    "a text": "llamacpp",
    "seed is negative": {**FP, "seed": -1},
    "seed is a text": {**FP, "seed": "7"},
    "hash is not hex": {**FP, "model_sha256": "z" * 64},
    "threads are NaN": {**FP, "numerics": [["n_threads", math.nan]]},
    "numerics are a mapping": {**FP, "numerics": {"n_threads": 2}},
    "a library without a version": {**FP, "libraries": [["torch"]]},
    "device of 1 MB": {**FP, "device": "x" * 1_000_000},
    "backend is a number": {**FP, "backend": 3},
    "sampler is a list": {**FP, "sampler": [1]},
    "an unknown field": {**FP, "why": "not"},
    "300 numeric settings": {**FP, "numerics": [[f"k{i}", i] for i in range(300)]},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_fingerprint_refuses_the_loom_file_in_one_line(case, tmp_path, library):
    path = tmp_path / "hostile.json"
    path.write_bytes(json.dumps(loom_with(HOSTILE[case]), allow_nan=True).encode())
    before = len(library.summaries())
    with pytest.raises(LoomImportError) as refused:
        import_loom_file(library, path)
    text = str(refused.value)
    # NaN is refused by the check every stored document gets (no NaN anywhere), before the fingerprint's own.
    assert ("fingerprint" in text or "nan (a number that is not finite)" in text), text
    assert "\n" not in text and len(text) < 300, text
    assert len(library.summaries()) == before


def test_stored_rows_without_or_with_a_broken_fingerprint_still_load(tmp_path):
    path = tmp_path / "db.sqlite3"
    store = Store(path)
    library = Library(store)
    conv = library.new()
    user = conv.add_message(None, "user", "hi")
    for stats in ({"seed": 3, "generated_tokens": 2},  # before fingerprints
                  {"seed": 4, "generated_tokens": 2, "fingerprint": FP}):
        answer = conv.add_message(user, "assistant")
        conv.update_message(answer, finish_reason="eos", stats=stats)
    conv.flush()
    store.close()
    # An older build (or a hand edit) stored a fingerprint that is not one: written around the app's checks.
    db = sqlite3.connect(path)
    db.execute("UPDATE messages SET stats_json = ? WHERE role = 'assistant' AND stats_json LIKE '%\"seed\": 4%'",
               (json.dumps({"seed": 4, "generated_tokens": 2, "fingerprint": {"seed": "x"}}),))
    db.commit()
    db.close()
    store = Store(path)
    try:
        answers = sorted((m for m in Library(store).open(conv.id).messages.values() if m.is_assistant),
                         key=lambda m: m.stats["seed"])
        assert answers[0].stats == {"seed": 3, "generated_tokens": 2} and answers[0].unreadable is None
        # Only the fingerprint is left out, with a note; the seed (what Replay needs) stays.
        assert answers[1].stats == {"seed": 4, "generated_tokens": 2}
        assert "fingerprint" in answers[1].unreadable
    finally:
        store.close()
