"""Exports after a token ban (a logit bias of -inf): standard JSON that our importers read back, and never a
partial file (issue 36, item 12). Real window, mock model."""

from __future__ import annotations

import json
import math

import pytest
from qt_helpers import send

from engine import SamplerSettings
from engine.experiments import read_trace

from app.actions.experiments import export_trace
from app.state.json_safe import json_safe, number_in
from app.state.loom_import import import_loom_file

BANNED = 7


def strict_json(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as every other JSON reader does."""

    def refuse(name: str):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def banned_answer(qtbot, window):
    window.settings.update_sampler(logit_bias=[[BANNED, False]])  # a ban, as llama.cpp's server spells it
    assert window.settings.options.sampler.logit_bias == ((BANNED, -math.inf),)
    answer = send(qtbot, window, "hello there")
    assert answer.request["sampler"]["logit_bias"] == [[BANNED, -math.inf]]
    return answer


def test_json_export_after_a_ban_is_standard_json(window, banned_answer, tmp_path):
    out = window.export("json", tmp_path / "chat.json")
    assert out is not None and out.exists()
    doc = strict_json(out.read_text(encoding="utf-8"))
    answer = next(m for m in doc["messages"] if m["id"] == banned_answer.id)
    assert answer["request"]["sampler"]["logit_bias"] == [[BANNED, False]]
    # Read back as the sampler settings they were.
    assert SamplerSettings.from_dict(answer["request"]["sampler"]).logit_bias == ((BANNED, -math.inf),)


def test_trace_export_after_a_ban_is_standard_json_and_reads_back(window, banned_answer, tmp_path):
    out = export_trace(window.context, tmp_path / "trace.jsonl")
    assert out is not None
    lines = out.read_text(encoding="utf-8").splitlines()
    assert all(strict_json(line) for line in lines)
    (run,) = read_trace(out)
    assert SamplerSettings.from_dict(run.header["settings"]).logit_bias == ((BANNED, -math.inf),)
    assert len(run.events()) == len(window.library.current.tokens(banned_answer))


def test_loom_export_after_a_ban_is_standard_json_and_imports_back(window, banned_answer, tmp_path):
    original = [t.token_id for t in window.library.current.tokens(banned_answer)]
    path = tmp_path / "tree.json"
    window.loom_view.export_to(path)
    doc = strict_json(path.read_text(encoding="utf-8"))
    assert doc["answers"][0]["request"]["sampler"]["logit_bias"] == [[BANNED, False]]
    conv, question = import_loom_file(window.library, path)
    (imported,) = conv.children(question.id)
    assert SamplerSettings.from_dict(imported.request["sampler"]).logit_bias == ((BANNED, -math.inf),)
    assert [t.token_id for t in conv.tokens(imported)] == original


def test_a_failed_export_leaves_no_partial_file_and_keeps_the_old_one(window, banned_answer, tmp_path, monkeypatch):
    """A value that cannot be written halfway through: no file, no temporary left, an older file untouched."""
    import app.actions.experiments as actions

    folder = tmp_path / "exports"
    folder.mkdir()
    out = folder / "trace.jsonl"
    out.write_text("the old trace\n", encoding="utf-8")
    real = actions.trace_lines

    def with_unwritable_tail(conv, message, engine):
        return [*real(conv, message, engine), {"type": "end", "value": {1, 2}}]  # a set: not JSON

    monkeypatch.setattr(actions, "trace_lines", with_unwritable_tail)
    assert export_trace(window.context, out) is None  # one dialog says why
    assert out.read_text(encoding="utf-8") == "the old trace\n"
    assert sorted(p.name for p in folder.iterdir()) == ["trace.jsonl"]  # no .part left behind
    fresh = folder / "fresh.jsonl"
    assert export_trace(window.context, fresh) is None
    assert not fresh.exists()


def test_json_safe_spells_every_non_finite_number_and_reads_back():
    doc = {"logit_bias": [[1, -math.inf], ["x", 2.0]], "stats": {"a": math.inf, "b": -math.inf, "c": math.nan},
           "list": [math.nan]}
    safe = json_safe(doc)
    text = json.dumps(safe, allow_nan=False)
    back = strict_json(text)
    assert back["logit_bias"] == [[1, False], ["x", 2.0]]
    assert back["stats"] == {"a": "inf", "b": "-inf", "c": "nan"} and back["list"] == ["nan"]
    assert number_in("-inf") == -math.inf and number_in("inf") == math.inf and math.isnan(number_in("nan"))
    assert number_in("blue") == "blue"
