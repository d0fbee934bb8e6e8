"""Issue 36 item 8: closing the window (or Ctrl-C) acts within a second while the engine is busy.

The window's close waited 10 s whenever the engine was busy: a question sent while a model still
loads (or connects to a server that never answers), a chat template still rendering. Here the real
session (`app.lifecycle.open_session`: window, host, database) closes in those states, and the test
measures from the close to the moment everything it owns is released (`close_session`), then reads
what was written.
"""

from __future__ import annotations

import threading
import time

import pytest

from app.controllers.engine_host import EngineHost
from app.lifecycle import close_session, open_session
from engine.engine import Engine
from engine.worker import ModelWorker
from qt_helpers import mock_factory, run_task

CLOSE_WITHIN_S = 1.0
# A template whose loop runs inside a filter (no time limit in-process could see it).
ENDLESS_TEMPLATE = "{{ ('<>' * 3000000)|striptags }}"


class _Backend:
    def close(self) -> None:
        pass


@pytest.fixture
def release():
    """Lets the loads that never end by themselves end after the test."""
    event = threading.Event()
    yield event
    event.set()


def _close(qtbot, session, *, by_signal: bool) -> float:
    t0 = time.monotonic()
    if by_signal:
        session.window.interrupt("SIGINT")  # what the SIGINT handler calls
    run_task(qtbot, close_session(session), timeout_ms=30000)
    return time.monotonic() - t0


@pytest.mark.parametrize("by_signal", [False, True], ids=["window-closed", "ctrl-c"])
def test_closing_while_a_question_waits_for_a_load_that_never_ends(qtbot, qloop, data_dir, release, by_signal):
    def factory(spec, backend, progress):
        return Engine(ModelWorker(lambda: (release.wait(60), _Backend())[1]))  # a connection that hangs

    session = open_session("light", host=EngineHost(factory))
    window = session.window
    session.host.load("http://127.0.0.1:9/v1", "remote")
    window.on_send("hi")  # waits for the model
    qtbot.waitUntil(lambda: window.controller.busy, timeout=5000)
    qtbot.wait(200)
    took = _close(qtbot, session, by_signal=by_signal)
    assert took < CLOSE_WITHIN_S, f"closing took {took:.2f} s"
    # The question and its (empty) answer were written and the answer is no longer generating.
    conv = window.library.current
    path = conv.path()
    assert path[0].content == "hi" and path[-1].is_assistant and not path[-1].generating
    assert _written(["hi"]), "the question must be on disk"


def _written(questions: list[str]) -> bool:
    """Every question is in the database file, each with an answer that is not left generating."""
    import sqlite3

    from app.state.paths import database_path

    db = sqlite3.connect(database_path())
    try:
        rows = db.execute("SELECT q.content FROM messages q JOIN messages a ON a.parent_id = q.id "
                          "WHERE q.role = 'user' AND a.role = 'assistant'").fetchall()
    finally:
        db.close()
    return sorted(questions) == sorted(r[0] for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("by_signal", [False, True], ids=["window-closed", "ctrl-c"])
def test_closing_while_the_chat_template_renders_without_end(qtbot, qloop, data_dir, tmp_path, by_signal):
    pytest.importorskip("llama_cpp")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from tiny_gguf import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "endless-template.gguf", chat_template=ENDLESS_TEMPLATE)
    session = open_session("light", host=EngineHost(mock_factory()))
    window = session.window
    assert run_task(qtbot, session.host.load(str(path), "llamacpp"), timeout_ms=60000)
    window.on_send("hi")
    qtbot.waitUntil(lambda: window.controller.busy, timeout=5000)
    qtbot.wait(500)  # rendering now (the template's limit is 5 s)
    took = _close(qtbot, session, by_signal=by_signal)
    assert took < CLOSE_WITHIN_S, f"closing took {took:.2f} s"
    assert _written(["hi"])


@pytest.mark.slow
def test_ctrl_c_in_the_app_while_connecting_to_a_server_that_never_answers(tmp_path):
    """The real `python -m app`, offscreen, told to open a server model whose server accepts and never answers."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests"))
    from remote_server import FakeServer, Reply

    server = FakeServer(lambda method, path, body: Reply(hang=True))
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "LOGITLAB_DATA_DIR": str(tmp_path / "data"),
           "LOGITLAB_LOG_DIR": str(tmp_path / "logs")}
    # Python's SIGINT handling restored even when this suite runs from a background shell.
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv[0] = 'app'; runpy.run_module('app', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", code, "--model", server.url], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not server.requests:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the app never connected"
            time.sleep(0.05)
        time.sleep(0.5)  # connecting now
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
    assert proc.returncode == 0, out
    assert took < 1.5, f"took {took:.2f} s to exit"
    assert "Traceback" not in out and "terminate called" not in out
