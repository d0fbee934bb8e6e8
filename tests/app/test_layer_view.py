"""The inspector's Layers tab on a real answer of the default model (llama.cpp): layer view, heatmap, attention.

The oracle for what it shows is the answer itself: the last layer of the view
is the model's own distribution, so the chosen token's probability there (and
across the heatmap's top row) equals the probability the decode loop recorded
when it wrote that token.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.controllers.engine_host import EngineHost
from app.widgets.fmt import pct
from qt_helpers import close_window, make_window, send

pytest.importorskip("llama_cpp")


def _open_layers_tab(w) -> None:
    w.inspector_dock.show()
    w.inspector.tabs.setCurrentWidget(w.inspector.layer_view)


@pytest.mark.slow
@pytest.mark.model
def test_layers_tab_on_a_real_answer(qtbot, qloop, store):
    host = EngineHost()  # the production factory: the default model on llama.cpp, on its own worker
    w = make_window(qtbot, store, host, max_new_tokens=10)
    try:
        task = w.start(None, "llamacpp")
        qtbot.waitUntil(task.done, timeout=120_000)
        assert task.result() is True
        w.settings.apply_preset("Greedy")
        answer = send(qtbot, w, "What is the capital of France?", timeout_ms=120_000)
        conv = w.library.current
        tokens = conv.tokens(answer)
        assert len(tokens) >= 4
        view = w.inspector.layer_view

        w.selection.set(answer.id, 2)
        qtbot.wait(300)
        assert view.view is None and view._task is None  # nothing runs while the tab is closed

        _open_layers_tab(w)
        qtbot.waitUntil(lambda: view.view is not None and view.heatmap.complete(), timeout=120_000)
        cap, ev = view.view.capture, tokens[2]
        assert view.view.index == 2 and cap.target_id == ev.token_id
        assert cap.n_layers == 30 and view.table.rowCount() == 30
        # the last layer is the model's own distribution: what the decode loop recorded for this token
        assert cap.layers[-1].target_logprob == pytest.approx(ev.logprob, abs=1e-3)
        assert cap.layers[-1].target_rank == ev.rank == 0  # greedy
        assert view.table.item(0, 0).text() == "29" and view.table.item(0, 1).text() == pct(ev.prob)
        assert view.table.item(0, 2).text() == "1"
        first = cap.first_top1_layer
        assert first is not None and f"first top-1 at layer <b>{first}</b> of 30" in view.status.text()
        assert view.table.item(29 - first, 2).text() == "1"
        assert all(view.table.item(29 - i, 2).text() != "1" for i in range(first))

        # the heatmap's top row: each token's probability at the last layer, as the answer recorded it
        assert 2 in view.heatmap.indices and len(view.heatmap.indices) == len(tokens)  # a short answer: every token
        for i in view.heatmap.indices:
            assert view.heatmap.value(29, i) == pytest.approx(tokens[i].prob, abs=0.02)

        # attention over the prompt and the answer before the token: a distribution, drawn over the text
        weights = view.attention.weights()
        assert len(weights) == view.view.answer_start + 2 and weights.sum() == pytest.approx(1.0, abs=1e-3)
        assert "capital" in view.attention.text.toPlainText() and "Most attended" in view.attention.summary.text()
        view.attention.layer_box.setCurrentIndex(view.attention.layer_box.findData(5))
        view.attention.head_box.setCurrentIndex(view.attention.head_box.findData(3))
        assert view.attention.weights().tolist() == pytest.approx(cap.attention[5, 3].tolist())

        # a click on the heatmap selects that token, and the view follows it
        rect = view.heatmap.column_rect(0)
        qtbot.mouseClick(view.heatmap, Qt.MouseButton.LeftButton, pos=rect.center().toPoint())
        assert (w.selection.message_id, w.selection.index) == (answer.id, 0)
        qtbot.waitUntil(lambda: view.view is not None and view.view.index == 0, timeout=120_000)
        assert view.view.capture.target_id == tokens[0].token_id
    finally:
        if not w._shutdown_done:
            close_window(qtbot, w)
        host.close()


def test_layers_tab_says_when_the_model_cannot(qtbot, window):
    """The mock model (as a server would) has no layer view: the tab says so in words."""
    answer = send(qtbot, window, "hello")
    window.selection.set(answer.id, 1)
    _open_layers_tab(window)
    view = window.inspector.layer_view
    qtbot.waitUntil(lambda: "cannot" in view.status.text(), timeout=15_000)
    assert "layer view needs a model that can show what each of its layers predicts" in view.status.text()
    assert view.view is None and view.table.rowCount() == 0


def test_heatmap_columns_around_the_selection_nearest_first():
    from app.controllers.lens_jobs import heatmap_columns, nearest_first

    assert heatmap_columns(5, 2) == (0, 1, 2, 3, 4)
    assert heatmap_columns(100, 50, 24) == tuple(range(38, 62))
    assert heatmap_columns(100, 1, 24) == tuple(range(0, 24))
    assert heatmap_columns(100, 99, 24) == tuple(range(76, 100))
    assert nearest_first(tuple(range(10)), 5, size=4) == [(3, 4, 5, 6), (1, 2, 7, 8), (0, 9)]


@pytest.mark.slow
def test_layers_tab_waits_for_the_answer_to_finish(qtbot, qloop, store):
    """Opened on a token of an answer still being written, the tab waits, then shows what the model can do."""
    from qt_helpers import answered, mock_factory, run_task

    host = EngineHost(mock_factory(delay_s=0.1))  # 24 tokens in ~2.4 s: time to open the tab mid-answer
    assert run_task(qtbot, host.load("mock", "mock"))
    w = make_window(qtbot, store, host)
    try:
        edit = w.chat.composer.edit
        edit.setPlainText("hello")
        qtbot.keyClick(edit, Qt.Key.Key_Return)
        def answer_under_way():
            conv = w.library.current
            path = conv.path() if conv is not None else []
            return bool(path) and path[-1].is_assistant and len(conv.tokens(path[-1])) >= 2

        qtbot.waitUntil(answer_under_way, timeout=15_000)
        answer = w.library.current.path()[-1]
        w.selection.set(answer.id, 1)
        _open_layers_tab(w)
        view = w.inspector.layer_view
        qtbot.waitUntil(lambda: "opens when the answer is finished" in view.status.text(), timeout=5_000)
        assert answer.generating
        qtbot.waitUntil(lambda: answered(w) and "cannot" in view.status.text(), timeout=15_000)
    finally:
        if not w._shutdown_done:
            close_window(qtbot, w)
        host.close()


@pytest.mark.slow
@pytest.mark.model
def test_whole_answer_bar_on_a_real_answer_is_the_engines_map(qtbot, qloop, store, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    from engine import documents
    from app.controllers.lens_jobs import answer_parts
    from app.widgets.inspection.passage_jobs import attached_messages, prompt_passages

    notes = tmp_path / "notes.txt"
    notes.write_text("The garden has twelve rose bushes.\n\nThe vault code is 4729.\n\nThe bus leaves at ten.\n")
    host = EngineHost()
    w = make_window(qtbot, store, host, max_new_tokens=6)
    try:
        task = w.start(None, "llamacpp")
        qtbot.waitUntil(task.done, timeout=120_000)
        w.settings.apply_preset("Greedy")
        monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(notes)], ""))
        qtbot.mouseClick(w.chat.composer.attach_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(w.chat.composer.attachments) == 1, timeout=10_000)
        answer = send(qtbot, w, "What is the vault code?", timeout_ms=120_000)
        view, panel = w.inspector.layer_view, w.inspector.layer_view.passages
        _open_layers_tab(w)
        w.selection.set(answer.id, 0)
        qtbot.waitUntil(lambda: panel.whole_button.isEnabled(), timeout=120_000)
        qtbot.mouseClick(panel.whole_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: bool(panel.answer_shares()), timeout=120_000)
        assert f"all {len(w.library.current.tokens(answer))} tokens" in panel.answer_bar.text()

        conv, engine = w.library.current, host.engine
        history, ids = answer_parts(conv, answer)
        prompt = history.token_ids(engine.tokenizer)
        passages = prompt_passages(engine.tokenizer, prompt, attached_messages(conv, answer))
        assert [p.label for p in passages] == ["notes.txt §1", "notes.txt §2", "notes.txt §3"]
        layers = documents.late_layers(30)  # the panel's default pick
        amap = engine.call(lambda b: documents.attention_map(
            b, prompt + ids, range(len(prompt), len(prompt) + len(ids)), passages, layers=layers)).result(120)
        assert panel.answer_shares() == pytest.approx(amap.share, rel=1e-9, abs=1e-12)
        view.show_token(None, None, None)  # another chat: the bar goes
        assert panel.answer_shares() == ()
    finally:
        if not w._shutdown_done:
            close_window(qtbot, w)
        host.close()
