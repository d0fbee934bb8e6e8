"""The window on the real default model (SmolLM2-135M-Instruct, torch): load, answer, inspect, branch."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.controllers.engine_host import EngineHost
from qt_helpers import answered, close_window, make_window, send


@pytest.mark.slow
@pytest.mark.model
def test_default_model_answers_streams_and_branches(qtbot, qloop, store, default_model_folder):
    host = EngineHost()  # the production factory: Engine.start on the engine's own thread
    w = make_window(qtbot, store, host, max_new_tokens=12)
    try:
        task = w.start(None, "torch")
        qtbot.waitUntil(task.done, timeout=180_000)
        assert task.result() is True, w.models.error_box.text() if w.models.error_box else ""
        assert host.info.name == "SmolLM2-135M-Instruct" and host.info.backend == "torch"
        assert "SmolLM2-135M-Instruct" in w.status.model_label.text()

        w.settings.apply_preset("Greedy")
        answer = send(qtbot, w, "What is the capital of France?", timeout_ms=120_000)
        conv = w.library.current
        tokens = conv.tokens(answer)
        assert "Paris" in answer.content
        assert answer.content == "".join(t.text for t in tokens)
        assert all(t.rank == 0 for t in tokens if not t.special)  # greedy picks the model's top token
        assert answer.stats["generated_tokens"] == len(tokens)
        assert "tok/s" in w.status.speed_label.text()
        assert w.status.context_label.text().endswith("/ 8,192")

        qtbot.keyClick(w, Qt.Key.Key_H, Qt.KeyboardModifier.ControlModifier)
        body = w.chat.chat_view.widget_for(answer.id).body
        qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=body.token_rect(1))
        chosen = tokens[1]
        assert w.inspector.selected_event() == chosen
        alt = next(p for p in chosen.top_model if p.token_id != chosen.token_id)
        w.inspector.table.select_token(alt.token_id)
        qtbot.mouseClick(w.inspector.branch_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: answered(w) and conv.path()[-1] is not answer, timeout=120_000)
        branch = conv.path()[-1]
        btokens = conv.tokens(branch)
        assert btokens[0].token_id == tokens[0].token_id
        assert btokens[1].token_id == alt.token_id and btokens[1].forced
        assert branch.stats["reused_tokens"] >= branch.stats["prompt_tokens"] - 1  # prefix KV cache reused
        assert w.chat.chat_view.widget_for(branch.id).sibling_label.text() == "2 / 2"
    finally:
        if not w._shutdown_done:
            close_window(qtbot, w)
        host.close()
