"""What a new user and a hostile world hit in the window's dialogs (issue 20, items 1, 5, 10, 22).

Open model after a server: the backend follows what is typed, any load error is a dialog, and no
sequence of dialog actions opens two pickers or leaves a dead one behind. File dialogs start in the
home folder or the last one used; an export that cannot be written is one dialog with the reason.
Deleting a conversation that is streaming stops its generation. Connecting to a server that accepts
and never answers can be cancelled.
"""

from __future__ import annotations

import gc
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialog, QDialogButtonBox, QFileDialog, QMessageBox, QProgressDialog, QPushButton

from shiboken6 import Shiboken

from app.widgets.dialogs.connect_dialog import ConnectChoice
from app.widgets.dialogs.model_picker import ModelPicker
from qt_helpers import run_task

SERVER = "http://127.0.0.1:9/v1#some-model"
HUB_ID = "HuggingFaceTB/SmolLM2-360M-Instruct"


def _visible(window, kind: type) -> list:
    return [w for w in window.findChildren(kind) if w.isVisible()]


def _when_shown(kind: type, act: Callable, seen: list) -> None:
    """Run `act(dialog)` once a `kind` dialog is shown: inside its own loop if it was exec()'d, else later."""

    def poll() -> None:
        dialog = next((w for w in QApplication.topLevelWidgets() if isinstance(w, kind) and w.isVisible()), None)
        if dialog is None:
            QTimer.singleShot(20, poll)
            return
        seen.append(len([w for w in QApplication.topLevelWidgets() if isinstance(w, kind) and w.isVisible()]))
        act(dialog)

    QTimer.singleShot(20, poll)


def _open(dialog: ModelPicker) -> None:
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Open).click()


# -- item 1: Open model ----------------------------------------------------------------------------


def test_the_backend_follows_what_is_typed(qtbot, store):
    picker = ModelPicker(store, SERVER, "remote")  # connected to a server: its backend is preselected
    qtbot.addWidget(picker)
    assert picker.backend == "remote"
    edit = picker.spec_box.lineEdit()
    edit.selectAll()
    qtbot.keyClicks(edit, HUB_ID)
    assert picker.spec == HUB_ID and picker.backend == "auto"  # a hub id is not for the server backend
    picker.spec_box.setCurrentText(SERVER)
    assert picker.backend == "remote"  # back to the model in use: its backend again
    picker.backend_box.setCurrentText("torch")  # the user's own choice is kept whatever is typed next
    picker.spec_box.setCurrentText("org/other")
    assert picker.backend == "torch"


def test_a_load_error_from_the_dialog_is_a_dialog(qtbot, window, host):
    """Remote chosen by hand for a hub id: one dialog saying why, never an uncaught error."""
    seen: list[int] = []

    def choose(picker: ModelPicker) -> None:
        picker.spec_box.setCurrentText(HUB_ID)
        picker.backend_box.setCurrentText("remote")
        _open(picker)

    _when_shown(ModelPicker, choose, seen)
    window.menu_actions.open_model.trigger()
    qtbot.waitUntil(lambda: window.models.error_box is not None and window.models.error_box.isVisible(), timeout=10000)
    text = window.models.error_box.text()
    assert "server URL" in text and "mock, is still loaded" in text
    assert "Error" not in text  # words for a person, not an exception's name
    assert host.info.name == "mock" and not host.loading
    assert window.menu_actions.open_model.isEnabled()


def test_open_model_twice_shows_one_dialog_which_is_deleted_when_closed(qtbot, window):
    """Ctrl+O pressed twice (or "Choose a model…" while a picker is open): one picker, raised, not two stacked."""
    seen: list[int] = []
    _when_shown(ModelPicker, lambda picker: picker.reject(), seen)
    window.menu_actions.open_model.trigger()
    window.menu_actions.open_model.trigger()
    qtbot.waitUntil(lambda: bool(seen), timeout=5000)
    qtbot.waitUntil(lambda: not window.findChildren(ModelPicker), timeout=5000)  # closed and deleted
    assert seen == [1]
    qtbot.wait(100)
    assert not window.findChildren(ModelPicker)  # no second one was waiting behind it


def test_choosing_auto_after_a_failed_remote_loads_and_no_dialog_is_left_over(qtbot, window, host):
    """The reported sequence: remote + hub id, then the dialog again with auto (here: the mock model).

    The segfault's cause: each closed picker lived on, owned by Python, in a reference cycle (its own
    signal connections, the failed load's traceback). The cyclic garbage collector runs on whichever
    thread happens to allocate when it triggers; on the model-loading thread it freed the picker and so
    deleted a QWidget off the GUI thread (seen: "Garbage-collecting" in the loader thread, then
    SIGSEGV). Closed dialogs are now deleted on the GUI thread, and none is left for the collector.
    """
    gc.collect()  # what earlier tests left, freed here on the GUI thread
    for spec, backend in ((HUB_ID, "remote"), ("mock", "auto")):
        seen: list[int] = []

        def choose(picker: ModelPicker, spec=spec, backend=backend) -> None:
            picker.spec_box.setCurrentText(spec)
            picker.backend_box.setCurrentText(backend)
            _open(picker)

        _when_shown(ModelPicker, choose, seen)
        window.menu_actions.open_model.trigger()
        qtbot.waitUntil(lambda: bool(seen) and not host.loading and not window.findChildren(ModelPicker), timeout=10000)
        if window.models.error_box is not None:
            window.models.error_box.done(0)
    assert host.info.name == "mock" and host.spec == "mock"
    assert window.menu_actions.open_model.isEnabled()
    qtbot.wait(50)  # deferred deletions
    assert not _dialogs_left_to_the_garbage_collector()


def _dialogs_left_to_the_garbage_collector() -> list[str]:
    """Dialogs whose Qt object is alive but reachable only through reference cycles."""
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what the collection finds, to look at it
    try:
        gc.collect()
        return [type(o).__name__ for o in gc.garbage if isinstance(o, QDialog) and Shiboken.isValid(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()  # freed now, on this (the GUI) thread


# -- item 5: files ----------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.chdir(tmp_path)  # the program's working folder, which no dialog should start in
    return folder


def test_export_dialog_starts_at_home_then_in_the_last_folder_used(qtbot, window, home, tmp_path, monkeypatch):
    window.chat.composer.edit.setPlainText("the cat")
    window.chat.composer.submit()
    qtbot.waitUntil(lambda: not window.controller.busy and len(window.library.current.path()) == 2, timeout=10000)
    starts: list[str] = []
    chosen = tmp_path / "exports" / "chat.md"
    chosen.parent.mkdir()

    def save_name(parent, caption, directory="", *_args, **_kwargs):
        starts.append(directory)
        return str(chosen), ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save_name))
    assert window.export("markdown") == chosen
    assert Path(starts[0]).parent == home and Path(starts[0]).name.endswith(".md")
    assert window.export("json") is not None
    assert Path(starts[1]).parent == chosen.parent and Path(starts[1]).suffix == ".json"


def test_model_file_dialogs_start_at_home_then_in_the_last_folder_used(qtbot, store, home, tmp_path, monkeypatch):
    starts: list[str] = []
    gguf = tmp_path / "models" / "tiny.gguf"
    gguf.parent.mkdir()

    def open_name(parent, caption, directory="", *_args, **_kwargs):
        starts.append(directory)
        return str(gguf), ""

    def folder_name(parent, caption, directory="", *_args, **_kwargs):
        starts.append(directory)
        return ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(open_name))
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(folder_name))
    picker = ModelPicker(store, None, "auto")
    qtbot.addWidget(picker)
    picker.gguf_button.click()
    assert Path(starts[0]) == home and picker.spec == str(gguf)
    again = ModelPicker(store, None, "auto")  # another day: the folder of the file chosen last
    qtbot.addWidget(again)
    again.folder_button.click()
    assert Path(starts[1]) == gguf.parent


@pytest.mark.parametrize("kind", ["json", "markdown"])
def test_export_that_cannot_be_written_is_one_dialog_with_the_reason(qtbot, window, tmp_path, kind):
    missing = tmp_path / "no-such-folder" / f"chat.{kind}"
    assert window.export(kind, missing) is None
    boxes = _visible(window, QMessageBox)
    assert len(boxes) == 1 and str(missing.parent) in boxes[0].text() and "No such file" in boxes[0].text()
    boxes[0].done(0)
    assert window.export(kind, tmp_path) is None  # onto a folder
    boxes = _visible(window, QMessageBox)
    assert len(boxes) == 1 and "folder" in boxes[0].text() and str(tmp_path) in boxes[0].text()
    boxes[0].done(0)


# -- item 10: deleting a streaming conversation -------------------------------------------------------


def test_deleting_a_streaming_conversation_from_another_one_stops_it(qtbot, window, monkeypatch):
    window.settings.set_max_new_tokens(3000)  # the mock model runs on to its end of text (~1-2 s) if not stopped
    window.chat.composer.edit.setPlainText("the cat sat")
    window.chat.composer.submit()
    streaming = window.library.current
    qtbot.waitUntil(lambda: window.controller.busy and bool(streaming.path()[-1].tokens), timeout=5000)
    answer = streaming.path()[-1]
    window.new_chat()
    assert window.library.current is not streaming
    # The list's search shows the streaming conversation only; it is the list's current row while
    # another conversation is open, so Delete deletes it.
    sidebar = window.sidebar
    qtbot.keyClicks(sidebar.search, "the cat sat")
    qtbot.waitUntil(lambda: sidebar.list.count() == 1 and sidebar.list.currentItem() is not None, timeout=5000)
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.StandardButton.Yes))
    sidebar.delete_button.click()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=3000)
    assert answer.finish_reason == "cancelled"  # stopped, not run on to its end
    assert window.store.conversation(streaming.id) is None
    assert window.library.current is not streaming


def test_the_list_refilled_while_delete_asks_still_deletes_the_conversation_asked_about(qtbot, window, monkeypatch):
    """The question runs its own event loop: a reload there (a streaming answer renames its conversation)
    deleted the list item the handler read afterwards (RuntimeError, and nothing was deleted)."""
    window.chat.composer.edit.setPlainText("the cat")
    window.chat.composer.submit()
    qtbot.waitUntil(lambda: not window.controller.busy and len(window.library.current.path()) == 2, timeout=10000)
    asked = window.library.current
    sidebar = window.sidebar
    qtbot.waitUntil(lambda: sidebar.list.currentItem() is not None and sidebar.list.currentItem().text() == "the cat")

    def ask(*_args, **_kwargs):
        sidebar._reload()  # what a list_changed during the question's event loop does
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", staticmethod(ask))
    with qtbot.captureExceptions() as exceptions:
        sidebar.delete_button.click()
    assert not exceptions
    assert asked.deleted and [row.title for row in window.store.conversations()] == ["New chat"]  # the one opened after


# -- item 22: a silent server --------------------------------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections on 127.0.0.1 and never answers a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    thread.join(2)
    for conn in accepted:
        conn.close()
    listener.close()


def test_connecting_to_a_silent_server_can_be_cancelled(qtbot, window, host, silent_server):
    choice = ConnectChoice(silent_server, "some-model", None, 60.0, False, False)
    loading = window.models.connect_server(choice)
    qtbot.waitUntil(lambda: bool(_visible(window, QProgressDialog)), timeout=5000)
    progress = _visible(window, QProgressDialog)[0]
    assert "127.0.0.1" in progress.labelText()
    assert host.loading
    progress.findChild(QPushButton).click()  # its Cancel
    qtbot.waitUntil(lambda: not host.loading, timeout=1000)  # not the server's 60 s
    assert run_task(qtbot, loading) is False
    assert host.info.name == "mock" and window.models.error_box is None  # cancelled: no error to report
    assert window.menu_actions.open_model.isEnabled() and window.menu_actions.connect_server.isEnabled()
