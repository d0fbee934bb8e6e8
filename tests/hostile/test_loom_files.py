"""Hostile loom files against the real import: each refused in one line, the database unchanged, the app
still starting; and a database an older version's import poisoned reads and starts (issue 36, item 1).

The files are made here (tests/hostile/loom_corpus.py): a real export, then one value made wrong per case.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from loom_corpus import CORPUS, QUESTION, good_loom

from app.state.conversation_list import Library
from app.state.loom_import import MAX_FILE_BYTES, LoomImportError, import_loom_file, read_loom_file
from app.state.loom_tree import answer_group, build_tree
from app.state.database.store import Store

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DB_NAME = "logitlab.sqlite3"
STORED_TABLES = ("conversations", "messages", "tokens")


def stored(db_path: Path) -> dict[str, list[tuple]]:
    """What the conversations, messages and tokens tables hold, read through a connection of its own."""
    conn = sqlite3.connect(db_path)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in STORED_TABLES}
    finally:
        conn.close()


@pytest.fixture
def library(tmp_path):
    """A file database holding one conversation the user cares about."""
    store = Store(tmp_path / DB_NAME)
    library = Library(store)
    conv = library.new()
    conv.add_message(None, "user", "a conversation that must survive")
    yield library
    store.close()


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 32


def test_the_good_file_imports_whole(tmp_path, library):
    """The corpus's base is a real export that imports: every refusal below is the change's doing."""
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good_loom()), encoding="utf-8")
    conv, question = import_loom_file(library, path)
    assert question.content == QUESTION and conv.system_prompt == "Be brief."
    _, answers = answer_group(conv, question)
    assert [len(conv.tokens(a)) for a in answers] == [2, 3]
    assert all(a.model["name"] == "TinyModel" and a.stats["seed"] == 7 and a.unreadable is None for a in answers)
    root = build_tree(conv, answers)
    assert len(root.children) == 1 and root.children[0].is_fork  # "Blue", then two branches
    reopened = Library(Store(library.store.path))
    try:
        again = reopened.open(conv.id)
        assert len(again.messages) == 3 and all(m.unreadable is None for m in again.messages.values())
    finally:
        reopened.store.close()


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_hostile_loom_file_is_refused_in_one_line_and_writes_nothing(case, tmp_path, library):
    path = tmp_path / "hostile.json"
    path.write_bytes(CORPUS[case]())
    before = stored(Path(library.store.path))
    conversations = len(library.summaries())
    with pytest.raises(LoomImportError) as refused:
        import_loom_file(library, path)
    text = str(refused.value)
    assert text.strip() and "\n" not in text and len(text) < 300, text
    assert "Traceback" not in text
    assert stored(Path(library.store.path)) == before  # nothing half-written
    assert len(library.summaries()) == conversations


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, library):
    path = tmp_path / "huge.json"
    with path.open("wb") as f:  # sparse: no disk used, and the import must not read it
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(LoomImportError, match="at most 64 MB"):
        import_loom_file(library, path)
    with pytest.raises(LoomImportError, match="not a regular file"):
        read_loom_file(tmp_path)


def test_a_failure_while_writing_leaves_nothing(tmp_path, library, monkeypatch):
    """One transaction: a write that fails after the conversation and some answers are in rolls all of it back."""
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good_loom()), encoding="utf-8")
    before = stored(Path(library.store.path))
    calls = []

    def failing(message_id, events):
        calls.append(message_id)
        if len(calls) == 2:
            raise sqlite3.OperationalError("disk I/O error")
        return original(message_id, events)

    original = library.store.write_tokens
    monkeypatch.setattr(library.store, "write_tokens", failing)
    with pytest.raises(LoomImportError, match="nothing was imported"):
        import_loom_file(library, path)
    assert len(calls) == 2  # it failed halfway through
    assert stored(Path(library.store.path)) == before


def _poison(db_path: Path) -> int:
    """Rows as an older version's import left them: wrong types in every answer field the window reads."""
    store = Store(db_path)
    library = Library(store)
    conv = library.new()
    user = conv.add_message(None, "user", "poisoned")
    good = conv.add_message(user, "assistant", "fine")
    conv.update_message(good, finish_reason="eos")
    store.close()
    conn = sqlite3.connect(db_path)
    with conn:
        for request, model, stats, finish, branch in (
            ('"temperature"', "[1, 2]", '"fast"', 3, "x"),
            ("[1]", '"TinyModel"', '{"decode_tokens_per_s": "fast", "generated_tokens": [1]}', "eos", 1.5),
            ('{"reasoning": ["<think>"]}', '{"name": ["x"]}', '{"total_s": NaN}', None, None),
            ("{not json", "[[[[", '{"generated_tokens": 3}', "length", -1),
        ):
            conn.execute(
                "INSERT INTO messages(conversation_id, parent_id, role, content, created, finish_reason, branch_index, "
                "request_json, model_json, stats_json) VALUES (?, ?, 'assistant', 'old answer', 0, ?, ?, ?, ?, ?)",
                (conv.id, user.id, finish, branch, request, model, stats),
            )
    conn.close()
    return conv.id


def test_poisoned_rows_read_as_typed_values_with_a_reason(tmp_path):
    conv_id = _poison(tmp_path / DB_NAME)
    store = Store(tmp_path / DB_NAME)
    try:
        rows = store.messages(conv_id)
        assert len(rows) == 6 and not store.damage_seen  # wrong types are not damage: nothing to repair
        poisoned = [r for r in rows if r.content == "old answer"]
        for r in poisoned:
            assert r.request is None or isinstance(r.request, dict)
            assert r.model is None or (isinstance(r.model, dict) and isinstance(r.model.get("name", ""), str))
            assert r.stats is None or isinstance(r.stats, dict)
            assert r.finish_reason in (None, "eos", "stop", "length", "cancelled", "error")
            assert r.branch_index is None or (isinstance(r.branch_index, int) and r.branch_index >= 0)
            assert r.unreadable and "\n" not in r.unreadable
        assert "model is a list" in poisoned[0].unreadable and "finish reason is '3'" in poisoned[0].unreadable
        assert poisoned[3].stats == {"generated_tokens": 3}  # what is readable stays
        assert all(r.unreadable is None for r in rows if r.content != "old answer")
    finally:
        store.close()


def _start_window(data_dir: Path, *imports: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOGITLAB_DATA_DIR": str(data_dir), "LOGITLAB_LOG_DIR": str(data_dir / "logs"),
           "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(HERE / "start_window.py"), *map(str, imports)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_the_window_starts_on_a_database_with_poisoned_rows(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _poison(data / DB_NAME)
    out = _start_window(data)
    assert out.returncode == 0 and "STARTED 1 6" in out.stdout, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


@pytest.mark.slow
def test_hostile_files_through_the_import_button_then_the_window_starts_again(tmp_path):
    """The six cases that used to leave a chat the window could not draw, and the ones that escaped the
    button: each imported through the real Loom tab's Import… button is one status line, nothing of it is
    stored, and the real window opens on the database again afterwards."""
    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / DB_NAME)
    conv = Library(store).new()
    conv.add_message(None, "user", "before")
    store.close()
    before = stored(data / DB_NAME)
    cases = ("request is a list", "model is a string", "stats hold text for a number", "branch index is a string",
             "stats are a string", "request is a string", "entropy is NaN", "token id is 2**63",
             "deep nesting (parser)", "finish reason is a number", "not UTF-8")
    files = []
    for n, case in enumerate(cases):
        files.append(tmp_path / f"hostile-{n}.json")
        files[-1].write_bytes(CORPUS[case]())
    out = _start_window(data, *files)
    assert out.returncode == 0 and "STARTED 1 1" in out.stdout, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    said = [line[len("IMPORT "):] for line in out.stdout.splitlines() if line.startswith("IMPORT ")]
    assert len(said) == len(cases)
    assert all(s.startswith("Loom: ") and "Imported" not in s and "\\n" not in s for s in said), said
    assert stored(data / DB_NAME)["messages"] == before["messages"] and stored(data / DB_NAME)["tokens"] == []
    again = _start_window(data)  # and the next start too
    assert again.returncode == 0 and "STARTED 1 1" in again.stdout, again.stderr[-3000:]
