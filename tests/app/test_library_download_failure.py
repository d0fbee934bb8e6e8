"""A failed download in Model ▸ Library is said in words, with no bar left behind and no advice to open the
Library from inside it (issue 43 item 6: a 0 % bar stayed, and the hub's failure said "(Model ▸ Library)")."""

from __future__ import annotations

import pytest
from download_server import DownloadServer

from test_library_dialog import _open_library, home  # noqa: F401 - the temporary home is a fixture


def _fail(qtbot, dialog, source: str) -> str:
    dialog.source.setText(source)
    task = dialog.start_download()
    assert dialog.progress.isVisible()  # the bar shows while it runs
    qtbot.waitUntil(task.done, timeout=30000)
    return dialog.progress_text.text()


def test_a_failed_download_hides_the_bar_and_says_why(qtbot, window, home):  # noqa: F811
    with DownloadServer() as server:
        dialog = _open_library(qtbot, window)
        said = _fail(qtbot, dialog, server.url("/missing.gguf"))
    assert said.startswith("Not downloaded: ") and "HTTP 404" in said, said
    assert not dialog.progress.isVisible() and dialog.download_button.isEnabled()


def test_a_hub_failure_does_not_point_to_the_library_from_inside_it(qtbot, window, home, monkeypatch):  # noqa: F811
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)  # the hub cannot be reached: its own offline mode
    dialog = _open_library(qtbot, window)
    said = _fail(qtbot, dialog, "someorg/some-model-GGUF")
    assert said.startswith("Not downloaded: cannot download 'someorg/some-model-GGUF'"), said
    assert "Model ▸ Library" not in said and "open one of the models listed above" in said, said
    assert not dialog.progress.isVisible()
