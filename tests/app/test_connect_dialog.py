"""Model ▸ Connect to server… against a real server: llama-cpp-python's, on the default model, on 127.0.0.1.

The dialog lists the server's models off the UI thread, connecting loads the
model through the host, answers stream with token records in both modes, the
status bar shows host and round trip, and what server-samples mode cannot do
(per-stage view, branching, settings the server has no parameter for) is
disabled with a tooltip saying why. A dead port is a message in the dialog.
"""

from __future__ import annotations

import logging
import re
import time

import pytest

pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the test extra)")

from app.state.models.servers import recent_servers  # noqa: E402
from app.widgets.dialogs.connect_dialog import ConnectDialog  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from qt_helpers import answered, run_task  # noqa: E402
from remote_server import free_port  # noqa: E402

SECRET = "sk-test-never-stored-7f3a"


def _ask(qtbot, window, text: str):
    """Send `text` and wait for its own answer (not the previous one, which is already finished)."""
    before = len(window.library.current.path()) if window.library.current else 0
    edit = window.chat.composer.edit
    edit.setFocus()
    edit.setPlainText(text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(window.library.current.path()) >= before + 2 and answered(window), timeout=60000)
    return window.library.current.path()[-1]


def _list(qtbot, dialog: ConnectDialog, url: str, timeout_ms: int = 15000) -> None:
    dialog.url_box.setCurrentText(url)
    task = dialog.refresh()
    assert task is not None
    qtbot.waitUntil(task.done, timeout=timeout_ms)


@pytest.mark.slow
def test_connect_chat_and_server_sampling_limits(qtbot, window, host, store, db_path, llama_server_url, caplog):
    caplog.set_level(logging.DEBUG)
    window.settings.set_max_new_tokens(3)
    assert window.menu_actions.connect_server.text() == "&Connect to server…"

    dialog = ConnectDialog(window.store, window.api_keys, False, window)
    _list(qtbot, dialog, llama_server_url)
    assert dialog.model_box.count() == 1 and dialog.model_box.currentText()  # the server's one model
    assert dialog.connect_button.isEnabled() and "1 model on this server" in dialog.message.text()
    dialog.key_edit.setText(SECRET)  # llama-cpp-python without --api_key accepts any key
    choice = dialog.choice()
    assert choice.url == llama_server_url and not choice.server_sampling
    dialog.accept()

    assert run_task(qtbot, window.models.connect_server(choice), timeout_ms=60000)
    info = host.info
    host_port = llama_server_url.split("//")[1].split("/")[0]
    assert info.backend == "remote" and info.device == host_port
    status = window.status
    assert host_port in status.model_label.text() and info.name in status.model_label.text()
    assert status.server_label.isVisible() and re.fullmatch(r"round trip \d+ ms", status.server_label.text())
    assert recent_servers(store)[0] == {"url": llama_server_url, "model": choice.model, "timeout_s": 60.0}

    # We sample: the answer streams as token records whose stages say where the distribution came from.
    answer = _ask(qtbot, window, "Name a colour.")
    assert answer.finish_reason in ("length", "eos") and answer.tokens
    assert answer.request["server_sampling"] is False and answer.model["backend"] == "remote"
    window.selection.set(answer.id, 0)
    inspector = window.inspector
    assert inspector.tabs.isTabEnabled(1)
    assert "from server" in inspector.stages.note.text()
    assert re.fullmatch(r"round trip \d+ ms", status.server_label.text())

    # The server samples: switched in the sampling panel; what it rules out is off, with the reason.
    panel = window.sampling
    assert panel.mode_box.isVisible() and panel.mode_box.server_samples.isEnabled()
    panel.mode_box.server_samples.click()
    assert window.settings.options.server_sampling
    typical = panel.rows["typical_p"]
    assert not typical.spin.isEnabled() and "no parameter" in typical.spin.toolTip()
    assert panel.rows["temperature"].spin.isEnabled()
    assert not inspector.branch_button.isEnabled() and "server" in inspector.branch_button.toolTip()

    streamed = _ask(qtbot, window, "Name an animal.")
    assert streamed.finish_reason in ("length", "eos") and streamed.tokens
    assert streamed.request["server_sampling"] is True
    assert all(t.top_model for t in streamed.tokens)  # the server's alternatives came with every token
    window.selection.set(streamed.id, 0)
    assert not inspector.tabs.isTabEnabled(1)
    assert "server sampled this answer" in inspector.tabs.tabToolTip(1)
    window.selection.set(answer.id, 0)  # the earlier answer still has its stage view
    assert inspector.tabs.isTabEnabled(1)

    # The key went to the keyring or this session only: never into the database or the log.
    window.library.current.flush()
    for path in db_path.parent.glob(db_path.name + "*"):
        assert SECRET.encode() not in path.read_bytes()
    assert SECRET not in caplog.text


def test_dead_port_is_a_clear_message_in_the_dialog(qtbot, window):
    dialog = ConnectDialog(window.store, window.api_keys, False, window)
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.perf_counter()
    _list(qtbot, dialog, url, timeout_ms=10000)
    assert time.perf_counter() - t0 < 6
    assert "connection refused" in dialog.message.text() and "127.0.0.1" in dialog.message.text()
    assert dialog.model_box.count() == 0 and not dialog.connect_button.isEnabled()
    dialog.url_box.setCurrentText("ftp://nowhere")
    assert dialog.refresh() is None and "not a server URL" in dialog.message.text()
    dialog.reject()


def test_the_menu_opens_the_dialog_with_the_last_server(qtbot, window, store):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.state.models.servers import remember_server

    dead = f"http://127.0.0.1:{free_port()}/v1"
    remember_server(store, dead, "some-model", 7.0)
    seen: dict[str, object] = {}

    def inspect_and_cancel() -> None:  # runs inside the dialog's own (modal) event loop
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, ConnectDialog) or dialog.listing is None or not dialog.listing.done():
            QTimer.singleShot(50, inspect_and_cancel)
            return
        seen.update(url=dialog.url_text(), timeout=dialog.timeout.value(), message=dialog.message.text())
        dialog.reject()

    QTimer.singleShot(50, inspect_and_cancel)
    window.menu_actions.connect_server.trigger()
    qtbot.waitUntil(lambda: "message" in seen, timeout=10000)
    assert seen["url"] == dead and seen["timeout"] == 7.0  # the last server, listed at once
    assert "connection refused" in str(seen["message"])
    assert window.host.info.name == "mock"  # cancelled: the model in use stays
