"""Compare models' result row takes the window's spare height (issue 43 item 6): the token view was sized to its
one line like a chat message (18 px), which held the whole row, list of largest divergences included, to a
small box, and the spare height went to empty bands around the labels above it."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.widgets.experiment_windows.model_diff_view import ModelDiffView


def test_the_token_view_and_the_divergence_list_fill_the_window(qtbot, window):
    view = ModelDiffView(window.host)
    qtbot.addWidget(view)
    view.resize(1000, 760)
    view.show()
    qtbot.waitExposed(view)
    view.text.setPlainText("The capital of France is Paris.")
    view.body.setPlainText("The capital of France is Paris.")  # one line, as a short comparison draws
    for i in range(40):
        view.top_list.addItem(f"KL 0.{i:04d}  ·  “token” (token {i})")
    for _ in range(5):
        QApplication.processEvents()
    height = view.height()
    assert view.body.height() > height * 0.4, (view.body.height(), height)
    assert view.top_list.height() > view.detail.height() and view.top_list.height() > height * 0.25
    # The labels above keep their own height: no band of empty space around them.
    for label in (view.models_label, view.summary):
        assert label.height() <= label.heightForWidth(label.width()) + 12, (label.accessibleName(), label.height())
