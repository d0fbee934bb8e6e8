"""A damaged, truncated, foreign, newer or unwritable database never locks the user out.

Each case starts from a real database written by the app's store with the mock
model's token records, damages the file the way a disk or a user would, then
opens it as the app does (`open_database`) in the real main window, and checks:
the window works, the notice says what was recovered and where the damaged
file is, and the file was moved aside — or left untouched where it must be.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from engine import Engine, GenerationRequest, SamplerSettings, TokenEvent
from engine.backends.mock import MockBackend

from app.main_window import NOTHING_SAVED
from app.state.database.recovery import open_database
from app.state.database.store import REPAIR_MARKER_SUFFIX, Store
from qt_helpers import close_window, make_window, run_task, send

CONVERSATIONS = 12
TOKENS = 60
PAGE = 4096


@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> Path:
    """A checkpointed database: 12 conversations, each a question and a 60-token answer with full records."""
    with Engine.from_backend(MockBackend(delay_s=0)) as engine:
        engine.wait_ready()
        # Seeded: an unseeded draw at temperature 1 ends on the mock's EOS before 60 tokens about 1 time in 120
        # (8 of 1000 runs), and the length assert below would fail every test of the module.
        request = GenerationRequest(
            messages=({"role": "user", "content": "the cat"},), max_new_tokens=TOKENS, top_n=20, record_stages=True,
            sampler=SamplerSettings(seed=1),
        )
        events = [e for e in engine.generate(request) if isinstance(e, TokenEvent)]
    assert len(events) == TOKENS
    path = tmp_path_factory.mktemp("template") / "logitlab.sqlite3"
    store = Store(path)
    for i in range(CONVERSATIONS):
        conv = store.create_conversation(f"conversation {i}")
        question = store.insert_message(conv.id, None, "user", f"question {i}")
        answer = store.insert_message(conv.id, question.id, "assistant", "".join(e.text for e in events))
        with store.transaction():
            store.write_tokens(answer.id, events)
    store.put_setting("appearance", "dark")
    store.close()  # checkpoints: everything is in the main file, no -wal
    assert not Path(str(path) + "-wal").exists()
    return path


@pytest.fixture
def db(template_db, data_dir) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "logitlab.sqlite3"
    shutil.copy(template_db, path)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _moved_aside(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.iterdir() if p.name.startswith(path.name + ".damaged-") and p.suffix != ".sqlite3-wal"
                  and not p.name.endswith(("-wal", "-shm")))


def _open_in_window(qtbot, host, path: Path):
    if host.engine is None:
        assert run_task(qtbot, host.load("mock", "mock"))
    opened = open_database(path)
    window = make_window(qtbot, opened.store, host)
    box = window.show_database_notice(opened.notice) if opened.notice is not None else None
    return opened, window, box


def _close(qtbot, window, opened, box) -> None:
    if box is not None and box.isVisible():
        box.done(0)  # the dialog's hook: never left waiting for a click
    if not window._shutdown_done:
        close_window(qtbot, window)
    opened.store.close()


def test_4kb_of_random_bytes_mid_file_is_recovered_and_the_file_moved_aside(qtbot, qloop, host, db):
    original = db.read_bytes()
    pages = len(original) // PAGE
    offset = (pages // 2) * PAGE  # a whole page in the middle: its header is garbage now
    _overwrite(db, offset, random.Random(1).randbytes(PAGE))
    damaged = db.read_bytes()

    opened, window, box = _open_in_window(qtbot, host, db)
    try:
        notice = opened.notice
        assert notice is not None and notice.kind == "recovered" and not notice.temporary
        moved = _moved_aside(db)
        assert moved == [notice.moved_to]
        assert moved[0].read_bytes() == damaged  # kept, unchanged
        # The dialog: one, on top of the real window, naming what was recovered and where the file is.
        assert box is not None and box.isVisible() and box.objectName() == "database_notice"
        assert str(notice.moved_to) in box.text()
        assert f"{CONVERSATIONS} of {CONVERSATIONS} conversations" in box.text()
        assert "token records" in box.text()
        # What it says was recovered is what the fresh database holds.
        store = opened.store
        rows = store.conversations()
        assert len(rows) == CONVERSATIONS
        tokens = sum(len(store.tokens(m.id)) for r in rows for m in store.messages(r.id) if m.role == "assistant")
        assert f"{tokens:,} of {CONVERSATIONS * TOKENS:,} token records" in box.text()
        assert CONVERSATIONS * TOKENS // 2 < tokens < CONVERSATIONS * TOKENS  # one page lost, not everything
        assert store.get_setting("appearance") == "dark"
        assert [str(r[0]) for r in sqlite3.connect(db).execute("PRAGMA quick_check")] == ["ok"]
        # And the app works on it: a new answer is saved.
        box.done(0)
        window.new_chat()
        answer = send(qtbot, window, "the dog")
        assert store.token_count(answer.id) == len(answer.tokens) > 0
        assert NOTHING_SAVED not in window.windowTitle()
    finally:
        _close(qtbot, window, opened, box)


def test_damage_met_while_reading_shows_what_is_readable_and_repairs_at_next_start(qtbot, qloop, host, db):
    # Zeros inside one token record's JSON, in the middle of the file: the B-tree is intact, so the
    # integrity check passes and only reading that record finds the damage.
    data = db.read_bytes()
    spot = data.find(b'{"m":[[', len(data) // 2)
    assert spot > 0
    _overwrite(db, spot + 10, b"\0" * 64)
    assert [str(r[0]) for r in sqlite3.connect(db).execute("PRAGMA quick_check")] == ["ok"]

    opened, window, box = _open_in_window(qtbot, host, db)
    assert opened.notice is None
    try:
        damaged_conv = None
        for row in opened.store.conversations():  # open each conversation as the sidebar would
            conv = window.library.open(row.id)
            assert window.library.current is conv and conv.title == row.title  # never under another title
            answer = conv.path()[-1]
            if len(conv.tokens(answer)) < TOKENS:
                damaged_conv = conv
                break
        assert damaged_conv is not None, "the damaged record was never met"
        shown = len(damaged_conv.tokens(damaged_conv.path()[-1]))
        assert 0 <= shown < TOKENS
        qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=3000)
        text = window.banner.label.text()
        assert f"{TOKENS - shown} of {TOKENS} token records" in text and "repair" in text
        assert Path(str(db) + REPAIR_MARKER_SUFFIX).exists()
    finally:
        _close(qtbot, window, opened, box)

    # The next start repairs it: moved aside, the readable part copied, one notice.
    opened, window, box = _open_in_window(qtbot, host, db)
    try:
        assert opened.notice is not None and opened.notice.kind == "recovered"
        assert "an earlier session could not read part of it" in box.text()
        assert _moved_aside(db) == [opened.notice.moved_to]
        assert not Path(str(db) + REPAIR_MARKER_SUFFIX).exists()
        counts = [len(opened.store.tokens(m.id)) for r in opened.store.conversations()
                  for m in opened.store.messages(r.id) if m.role == "assistant"]
        assert sorted(counts) == sorted([shown] + [TOKENS] * (CONVERSATIONS - 1))
        assert opened.store.damage_seen == []  # the fresh database reads clean
    finally:
        _close(qtbot, window, opened, box)


@pytest.mark.parametrize("damage", ["truncated", "not_sqlite", "first_page"])
def test_truncated_foreign_or_headless_file_is_moved_aside_and_the_app_starts(qtbot, qloop, host, db, damage):
    if damage == "truncated":
        with open(db, "r+b") as f:
            f.truncate(os.path.getsize(db) // 2)
    elif damage == "not_sqlite":
        db.write_text("these are my notes, not a database\n" * 200)
    else:
        _overwrite(db, 0, random.Random(2).randbytes(PAGE))
    damaged = db.read_bytes()

    opened, window, box = _open_in_window(qtbot, host, db)
    try:
        notice = opened.notice
        assert notice is not None and notice.kind == "recovered" and box.isVisible()
        assert _moved_aside(db) == [notice.moved_to] and notice.moved_to.read_bytes() == damaged
        assert str(notice.moved_to) in box.text() and str(db) in box.text()
        if damage == "truncated":  # the first half is still there
            assert "conversations" in box.text()
            assert 0 < len(opened.store.conversations()) <= CONVERSATIONS
        else:
            assert "Nothing in it could be read" in box.text()
            assert opened.store.conversations() == [] or len(opened.store.conversations()) == 1  # the new chat
        box.done(0)
        answer = send(qtbot, window, "the cat")
        assert opened.store.token_count(answer.id) == len(answer.tokens) > 0  # saving works again
    finally:
        _close(qtbot, window, opened, box)


def test_newer_schema_is_left_untouched_and_the_app_runs_without_saving(qtbot, qloop, host, db):
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA user_version = 7")
    raw.close()
    before = _digest(db)

    opened, window, box = _open_in_window(qtbot, host, db)
    try:
        assert opened.notice is not None and opened.notice.kind == "newer" and opened.store.temporary
        assert "newer version of Logit Lab" in box.text() and str(db) in box.text()
        assert NOTHING_SAVED in window.windowTitle()
        assert window.banner.isVisible() and "nothing is saved" in window.banner.label.text()
        assert _moved_aside(db) == []
        send(qtbot, window, "the cat")  # usable, in memory
        # Quit from the dialog closes the window.
        box.findChild(type(box.buttons()[0]), "quit").click()
        qtbot.waitUntil(lambda: window._shutdown_done, timeout=10000)
    finally:
        _close(qtbot, window, opened, box)
    assert _digest(db) == before
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 7


def _make_unwritable(target: Path) -> None:
    if os.geteuid() == 0:  # root ignores permission bits; the immutable flag stops it
        if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode != 0:
            pytest.skip("running as root without chattr +i: cannot make a file unwritable")
    else:
        target.chmod(0o555 if target.is_dir() else 0o444)


def _make_writable(target: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(target)], capture_output=True)
    else:
        target.chmod(0o755 if target.is_dir() else 0o644)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_unwritable_database_runs_on_a_temporary_one_and_says_so(qtbot, qloop, host, db, what):
    target = db if what == "file" else db.parent
    before = _digest(db)
    _make_unwritable(target)
    try:
        opened, window, box = _open_in_window(qtbot, host, db)
        try:
            assert opened.notice is not None and opened.notice.kind == "unusable" and opened.store.temporary
            assert str(db) in box.text() and "cannot be opened for writing" in box.text()
            assert NOTHING_SAVED in window.windowTitle()
            names = [b.objectName() for b in box.buttons()]
            assert "continue_temporary" in names and "quit" in names
            box.findChild(type(box.buttons()[0]), "continue_temporary").click()
            qtbot.waitUntil(lambda: not box.isVisible(), timeout=3000)
            send(qtbot, window, "the cat")
            assert window.isVisible()
        finally:
            _close(qtbot, window, opened, box)
    finally:
        _make_writable(target)
    assert _digest(db) == before


def test_a_served_conversation_is_recovered_as_served(tmp_path):
    """Salvage copies the served record with its conversation (it was dropped: a recovered served conversation
    became a plain chat, its client and request gone)."""
    from app.state.database.recovery import salvage_into

    source = Store(tmp_path / "source.sqlite3")
    served = {"id": "chatcmpl-1", "client": "127.0.0.1:5000", "endpoint": "chat.completions"}
    conv = source.create_conversation("served", served=served)
    source.insert_message(conv.id, None, "user", "hello")
    source.create_conversation("own")
    source.close()
    target = Store(tmp_path / "target.sqlite3")
    result = salvage_into(tmp_path / "source.sqlite3", target)
    rows = {r.title: r for r in target.conversations()}
    assert result.conversations == 2 and rows["served"].served == served and rows["own"].served is None
    target.close()
