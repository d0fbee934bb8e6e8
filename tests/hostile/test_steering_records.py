"""An answer's recorded steering in loom files: exported and imported whole, and every bad value refused in one
line with nothing written (the record is data from anywhere: app/state/steering_record.py)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from loom_corpus import good_loom

from app.state.conversation_list import Library
from app.state.loom_import import LoomImportError, import_loom_file
from app.state.loom_tree import answer_group, export_tree
from app.state.database.store import Store

RECORD = {
    "vectors": [{"name": "happy", "sha256": "3f2a9c0d11b2e4f5", "n_layer": 30, "n_embd": 576, "model_hint": "llama",
                 "strength": 1.5}],
    "layer_start": 4,
    "layer_end": 20,
}


def _with(record) -> dict:
    doc = copy.deepcopy(good_loom())
    doc["answers"][0]["request"]["steering"] = record
    return doc


def _bad(change) -> dict:
    record = copy.deepcopy(RECORD)
    change(record)
    return _with(record)


BAD = {
    "strength NaN": (_bad(lambda r: r["vectors"][0].update(strength=math.nan)), "holds nan (a number that is not finite)"),
    "strength Infinity": (_bad(lambda r: r["vectors"][0].update(strength=math.inf)), "holds inf (a number that is not finite)"),
    "strength a string": (_bad(lambda r: r["vectors"][0].update(strength="lots")), "not a finite number ('lots')"),
    "strength true": (_bad(lambda r: r["vectors"][0].update(strength=True)), "not a finite number (True)"),
    "strength huge": (_bad(lambda r: r["vectors"][0].update(strength=1e9)), "beyond ±1000"),
    "no strength": (_bad(lambda r: r["vectors"][0].pop("strength")), "not a finite number (None)"),
    "hash not hex": (_bad(lambda r: r["vectors"][0].update(sha256="../../etc/passwd")), "no content hash"),
    "hash missing": (_bad(lambda r: r["vectors"][0].pop("sha256")), "no content hash"),
    "name empty": (_bad(lambda r: r["vectors"][0].update(name="  ")), "has no name"),
    "name a list": (_bad(lambda r: r["vectors"][0].update(name=["x"])), "has no name"),
    "width negative": (_bad(lambda r: r["vectors"][0].update(n_embd=-5)), "n_embd that is not a positive"),
    "vector a string": (_bad(lambda r: r.update(vectors=["happy"])), "vector 1 is not a mapping"),
    "vectors empty": (_bad(lambda r: r.update(vectors=[])), "has no list of vectors"),
    "vectors a mapping": (_bad(lambda r: r.update(vectors={"a": 1})), "has no list of vectors"),
    "too many vectors": (_bad(lambda r: r.update(vectors=r["vectors"] * 65)), "names 65 vectors"),
    "layer 0": (_bad(lambda r: r.update(layer_start=0)), "layer_start is 0"),
    "layer a fraction": (_bad(lambda r: r.update(layer_end=2.5)), "layer_end is 2.5"),
    "range empty": (_bad(lambda r: r.update(layer_start=9, layer_end=3)), "layer range 9..3 is empty"),
    "steering a list": (_with([1, 2]), "steering is not a mapping"),
    "steering a string": (_with("happy x2"), "steering is not a mapping"),
}


@pytest.fixture
def library(tmp_path):
    store = Store(tmp_path / "steer.sqlite3")
    library = Library(store)
    yield library
    store.close()


def test_a_recorded_steering_goes_out_and_comes_back_whole(tmp_path, library):
    path = tmp_path / "steered.json"
    path.write_text(json.dumps(_with(RECORD)), encoding="utf-8")
    conv, question = import_loom_file(library, path)
    _, answers = answer_group(conv, question)
    assert answers[0].request["steering"] == RECORD and "steering" not in answers[1].request
    again = export_tree(conv, question)  # exported once more: the record travels on unchanged
    assert again["answers"][0]["request"]["steering"] == RECORD
    reopened = Library(Store(library.store.path))
    try:
        stored = reopened.open(conv.id).messages[answers[0].id]
        assert stored.request["steering"] == RECORD and stored.unreadable is None
    finally:
        reopened.store.close()


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_steering_record_is_refused_in_one_line_and_nothing_is_written(case, tmp_path, library):
    doc, words = BAD[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")
    before = len(library.store.conversations())
    with pytest.raises(LoomImportError) as refused:
        import_loom_file(library, path)
    message = str(refused.value)
    assert "\n" not in message and words in message, message
    assert len(library.store.conversations()) == before
