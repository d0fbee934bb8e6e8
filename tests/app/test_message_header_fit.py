"""A message's header and stats fit a narrow chat column (380 px, the 1024x700 window's): every button shows its
whole label next to the version arrows, the model's name gives way ("…", whole in its tooltip), and the stats
line wraps rather than being cut."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt

from app.state.conversation_list import Library
from app.widgets.chat.message_widget import MessageWidget

STATS = {"generated_tokens": 64, "decode_tokens_per_s": 63.5, "time_to_first_token_s": 0.23, "seed": 1}
NAME = "SmolLM2-135M-Instruct-Q4_K_M"


def test_the_header_and_stats_fit_a_380_px_column(qtbot, store):
    conv = Library(store).new()
    user = conv.add_message(None, "user", "Why is the sky blue?")
    for text in ("One answer", "The sky is blue because"):
        answer = conv.add_message(user, "assistant", text, model={"name": NAME})
        conv.update_message(answer, finish_reason="length", stats=STATS)
    widget = MessageWidget(conv, answer)
    qtbot.addWidget(widget)
    widget.setFixedWidth(380)  # as the chat column holds it
    widget.show()
    qtbot.waitExposed(widget)
    qtbot.wait(50)
    assert widget.width() == 380
    shown = [b for b in (widget.prev_button, widget.next_button, widget.regen_button, widget.continue_button,
                         widget.copy_button) if b.isVisible()]
    assert len(shown) == 5  # a cut-off answer with two versions: every control is there
    for w in (*shown, widget.role_label, widget.sibling_label):
        assert w.width() >= w.sizeHint().width(), f"{w.accessibleName() or w.text()} is squeezed to {w.width()} px"
    assert html.escape(NAME) in widget.model_label.toolTip()
    footer = widget.footer
    assert "first token 0.23 s" in footer.text() and "cut off" in footer.text()
    lines = footer.fontMetrics().boundingRect(0, 0, footer.contentsRect().width(), 10_000,
                                              int(Qt.TextFlag.TextWordWrap), footer.text())
    fits_one_line = footer.fontMetrics().horizontalAdvance(footer.text()) <= footer.contentsRect().width()
    assert fits_one_line or (footer.wordWrap() and lines.height() <= footer.contentsRect().height())
    assert widget.regen_button.accessibleName() == "Regenerate" and "Regenerate" in widget.regen_button.toolTip()
