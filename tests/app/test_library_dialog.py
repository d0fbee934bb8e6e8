"""Model ▸ Library in the real window: the table lists what a temporary home holds (and the recent models),
search filters it, Open loads the model through the window's own load path (a real GGUF on llama.cpp), and a
download from a real HTTP server on 127.0.0.1 shows its progress, can be cancelled, and selects what it got."""

from __future__ import annotations

import pytest

from download_server import DownloadServer, Served
from library_layouts import lmstudio_model, ollama_model, put_gguf

from app.widgets.dialogs.library_dialog import LibraryDialog
from app.widgets.dialogs.model_picker import recent_models, remember_model

STORE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "XDG_DATA_HOME", "OLLAMA_MODELS", "LLAMA_CACHE",
                   "LOGITLAB_MODEL_FOLDERS")


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LOGITLAB_MODELS_DIR", str(home / "logitlab-models"))
    monkeypatch.setenv("LOGITLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LOGITLAB_DEFAULT_MODEL", str(tmp_path / "no-default-model-here.gguf"))
    return home


def _open_library(qtbot, window) -> LibraryDialog:
    window.menu_actions.library.trigger()
    dialog = window.findChild(LibraryDialog)
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: dialog.scanning is not None and dialog.scanning.done(), timeout=15000)
    return dialog


def _names(dialog) -> list[str]:
    return [dialog.table.item(r, 0).text() for r in range(dialog.table.rowCount())]


def test_the_library_lists_the_home_recent_models_first_and_search_filters(qtbot, window, home, tmp_path):
    lmstudio_model(home, "pub", "Tiny-GGUF", "Tiny-Q8_0.gguf", n_ctx=512)
    ollama_model(home / ".ollama" / "models", "tiny", "latest", put_gguf(tmp_path / "o.gguf", seed=1).read_bytes())
    (home / "broken").mkdir()
    (home / "broken" / "cut.gguf").write_bytes(put_gguf(tmp_path / "c.gguf", seed=2).read_bytes()[:1000])
    window.store.put_setting("library_folders", [str(home / "broken")])
    remember_model(window.store, "http://127.0.0.1:9/v1#served", "remote")
    remember_model(window.store, "org/some-model", "torch")
    dialog = _open_library(qtbot, window)
    assert _names(dialog)[:2] == ["org/some-model", "http://127.0.0.1:9/v1#served"]  # recent first, newest first
    assert {"pub/Tiny-GGUF", "tiny:latest", "cut"} <= set(_names(dialog))  # LM Studio's publisher/repo
    row = dialog.rows[_names(dialog).index("pub/Tiny-GGUF")]
    assert (row.source, row.architecture, row.quantization, row.context) == ("LM Studio", "llama", "F32", "512")
    assert row.backend and "fits" in row.memory
    # Counted as listed: 5 rows, 3 of them found on disk, 2 only in the recent list (issue 37: "1 model in 1
    # place" was said while 2 rows showed).
    assert dialog.summary.text().startswith("5 models (3 found in ") and ", 2 opened recently)" in dialog.summary.text()

    dialog.select(dialog.rows[_names(dialog).index("cut")].spec)
    assert not dialog.open_button.isEnabled()  # a file that cannot be read is listed, with why, but not opened
    assert "truncated" in dialog.table.item(dialog.table.currentRow(), 0).toolTip()

    qtbot.keyClicks(dialog.search, "ollama")
    assert _names(dialog) == ["tiny:latest"]
    assert dialog.summary.text().startswith("1 of 5 models")
    dialog.search.clear()
    assert len(_names(dialog)) == 5


def test_open_loads_the_selected_model_the_way_open_model_does(qtbot, window, home):
    pytest.importorskip("llama_cpp")
    path = lmstudio_model(home, "pub", "Tiny-GGUF", "Tiny-Q8_0.gguf")
    dialog = _open_library(qtbot, window)
    assert dialog.select(str(path))
    qtbot.mouseClick(dialog.open_button, qtbot_left())
    qtbot.waitUntil(lambda: not window.host.loading and window.host.spec == str(path), timeout=30000)
    assert window.host.info is not None and window.host.info.backend == "llamacpp"
    # the load's own task records the model once it resumes after the load: a loop turn after `loading` clears
    qtbot.waitUntil(lambda: bool(recent_models(window.store)), timeout=5000)
    assert recent_models(window.store)[0] == {"spec": str(path), "backend": "auto"}
    assert window.findChild(LibraryDialog) is None  # closed and deleted once the model was chosen


@pytest.mark.slow
def test_a_download_shows_progress_can_be_cancelled_and_then_completes(qtbot, window, home, tmp_path):
    data = put_gguf(tmp_path / "t.gguf").read_bytes()
    data += bytes(1_200_000 - len(data)) if len(data) < 1_200_000 else b""  # padding after the tensors: still a GGUF
    with DownloadServer() as server:
        server.files["/tiny.gguf"] = Served(data, delay_s=0.05)
        dialog = _open_library(qtbot, window)
        dialog.source.setText(server.url("/tiny.gguf"))
        qtbot.mouseClick(dialog.download_button, qtbot_left())
        qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=15000)
        qtbot.waitUntil(lambda: "left" in dialog.progress_text.text(), timeout=15000)  # once a speed is measured
        text = dialog.progress_text.text()
        assert dialog.progress.isVisible() and " of 1.2 MB" in text and "/s" in text
        assert not dialog.download_button.isEnabled()
        qtbot.mouseClick(dialog.cancel_button, qtbot_left())
        qtbot.waitUntil(lambda: dialog.downloading.done(), timeout=15000)
        assert "cancelled" in dialog.progress_text.text() and dialog.download_button.isEnabled()
        kept = (home / "logitlab-models" / "tiny.gguf.part").stat().st_size
        assert 0 < kept < len(data)

        server.files["/tiny.gguf"] = Served(data)
        qtbot.mouseClick(dialog.download_button, qtbot_left())
        qtbot.waitUntil(lambda: dialog.downloading.done() and dialog.scanning.done(), timeout=15000)
    target = home / "logitlab-models" / "tiny.gguf"
    assert target.read_bytes() == data and server.requests[-1][1] == f"bytes={kept}-"  # resumed where it stopped
    assert dialog.selected_row() is not None and dialog.selected_row().spec == str(target)
    assert dialog.open_button.isEnabled() and "Downloaded" in dialog.progress_text.text()


def test_a_failed_download_is_one_sentence_in_the_dialog(qtbot, window, home):
    with DownloadServer() as server:
        dialog = _open_library(qtbot, window)
        dialog.source.setText(server.url("/missing.gguf"))
        task = dialog.start_download()
        qtbot.waitUntil(task.done, timeout=15000)
    assert "HTTP 404" in dialog.progress_text.text() and dialog.download_button.isEnabled()


def test_a_recent_model_opened_from_elsewhere_has_its_facts(qtbot, window, home, tmp_path):
    elsewhere = put_gguf(tmp_path / "elsewhere" / "mine.gguf", n_ctx=384)
    remember_model(window.store, str(elsewhere), "llamacpp")
    dialog = _open_library(qtbot, window)
    row = dialog.rows[0]
    assert row.spec == str(elsewhere) and row.recent and row.backend == "llamacpp"
    assert (row.architecture, row.context, row.quantization) == ("llama", "384", "F32")  # not an empty row
    assert dialog.summary.text().startswith("1 model (0 found in ") and "1 opened recently" in dialog.summary.text()


def test_a_download_whose_file_name_is_taken_asks_first(qtbot, window, home, tmp_path, monkeypatch):
    first = put_gguf(tmp_path / "a.gguf", seed=1).read_bytes()
    second = put_gguf(tmp_path / "b.gguf", seed=2).read_bytes()
    models = home / "logitlab-models"
    models.mkdir()
    (models / "tiny.gguf").write_bytes(first)
    asked = []
    with DownloadServer() as server:
        server.files["/other/tiny.gguf"] = Served(second)
        dialog = _open_library(qtbot, window)
        dialog.source.setText(server.url("/other/tiny.gguf"))
        monkeypatch.setattr(dialog, "ask_if_exists", lambda target: asked.append(target) or None)
        assert dialog.start_download() is None  # cancelled at the question: nothing sent
        assert asked == [models / "tiny.gguf"] and server.requests == []
        monkeypatch.setattr(dialog, "ask_if_exists", lambda target: "keep-both")
        task = dialog.start_download()
        qtbot.waitUntil(lambda: task.done() and dialog.scanning.done(), timeout=15000)
    assert (models / "tiny.gguf").read_bytes() == first
    assert (models / "tiny (2).gguf").read_bytes() == second
    assert dialog.selected_row().spec == str(models / "tiny (2).gguf")


def qtbot_left():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton
