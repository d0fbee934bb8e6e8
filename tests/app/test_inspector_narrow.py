"""The inspector's heading in a narrow dock: nothing is cut off under the ◀ ▶ buttons.

At 1024x700 the README's branch state read "␣scattering token 38 of 125 · id 24484 force": the one-line
heading was wider than the dock and the end of "forced" was cut off.
"""

from __future__ import annotations

from engine.backends.mock import PIECES
from PySide6.QtWidgets import QLabel

from app.widgets.inspection.inspector import MIN_WIDTH, Inspector
from qt_helpers import answered, run_task, send


def _whole(label: QLabel) -> bool:
    """Whether the label shows all of its text in the room it has."""
    if label.wordWrap():
        return label.heightForWidth(label.width()) <= label.height()
    return label.sizeHint().width() <= label.width()


def test_a_forced_tokens_heading_wraps_in_a_narrow_inspector(qtbot, window):
    window.settings.update_sampler(seed=11)
    answer = send(qtbot, window, "the cat")
    conv = window.library.current
    tokens = conv.tokens(answer)
    index = 4
    longest = max(PIECES, key=len)  # " temperature": the mock model's longest word, forced at token 5
    forced_id = PIECES.index(longest)
    assert tokens[index].token_id != forced_id
    run_task(qtbot, window.controller.branch(answer, index, forced_id))
    qtbot.waitUntil(lambda: answered(window))
    branch = conv.path()[-1]
    inspector = Inspector(window.library, window.selection, window.controller)
    qtbot.addWidget(inspector)
    inspector.resize(MIN_WIDTH, 700)  # the dock at its least, as on a 1024 px screen beside the loom
    inspector.show()
    qtbot.waitExposed(inspector)
    window.selection.set(branch.id, index)
    qtbot.wait(50)
    label = inspector.token_label
    assert "forced" in label.text() and f"id {forced_id}" in label.text()
    assert _whole(label), (label.sizeHint().width(), label.width())
    assert label.geometry().right() < inspector.prev_button.geometry().left()
