"""The window on the default model running natively on llama.cpp: load, answer, status bar, branch."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.controllers.engine_host import EngineHost
from app.widgets.dialogs.model_picker import BACKENDS
from qt_helpers import answered, close_window, make_window, send

pytest.importorskip("llama_cpp")


def test_the_model_picker_offers_every_engine_backend_but_the_mock():
    assert "llamacpp" in BACKENDS and "auto" in BACKENDS and "mock" not in BACKENDS


@pytest.mark.slow
@pytest.mark.model
def test_default_model_on_llamacpp_answers_shows_quantization_and_branches(qtbot, qloop, store):
    host = EngineHost()  # the production factory: Engine.start on the engine's own thread
    w = make_window(qtbot, store, host, max_new_tokens=12)
    try:
        task = w.start(None, "llamacpp")
        qtbot.waitUntil(task.done, timeout=120_000)
        assert task.result() is True, w.models.error_box.text() if w.models.error_box else ""
        assert host.info.backend == "llamacpp" and host.info.quantization == "Q4_1"
        label = w.status.model_label.text()
        assert "llamacpp" in label and "Q4_1" in label and "MiB" in label
        assert "quantization:   Q4_1" in w.status.model_label.toolTip()

        w.settings.apply_preset("Greedy")
        answer = send(qtbot, w, "What is 2+2?", timeout_ms=120_000)
        conv = w.library.current
        tokens = conv.tokens(answer)
        assert answer.content and answer.content == "".join(t.text for t in tokens)
        assert all(t.rank == 0 for t in tokens if not t.special)

        qtbot.keyClick(w, Qt.Key.Key_H, Qt.KeyboardModifier.ControlModifier)
        body = w.chat.chat_view.widget_for(answer.id).body
        qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=body.token_rect(1))
        chosen = tokens[1]
        alt = next(p for p in chosen.top_model if p.token_id != chosen.token_id)
        w.inspector.table.select_token(alt.token_id)
        qtbot.mouseClick(w.inspector.branch_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1] is not answer, timeout=120_000)
        branch = conv.path()[-1]
        assert conv.tokens(branch)[1].token_id == alt.token_id
        assert branch.stats["reused_tokens"] >= branch.stats["prompt_tokens"] - 1  # llama.cpp's KV cache trimmed, not rebuilt
    finally:
        if not w._shutdown_done:
            close_window(qtbot, w)
        host.close()
