"""The reasoning of an answer (`<think>…</think>`) as a collapsible "Thinking" block above the answer proper.

Collapsed it is one line ("▸ Thinking · 212 tokens"); open, it shows the
reasoning as Markdown, or as coloured tokens in the token view, where a
click inspects the token as anywhere else (the message maps indices).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QRectF, Qt, Signal
from PySide6.QtGui import QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QFrame, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.widgets.chat.message_body import MessageBody


class ThinkingBlock(QFrame):
    toggled = Signal(bool)  # expanded

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.setAccessibleName("Thinking")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 0, 0, 2)
        layout.setSpacing(0)
        self.toggle = QToolButton(self)
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.toggle.setAccessibleName("Show thinking")
        self.toggle.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.toggle.toggled.connect(self._on_toggled)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.body = MessageBody(self)
        self.body.setAccessibleName("Thinking text")
        self._muted = True
        self._mute_text()
        self.body.setVisible(False)
        layout.addWidget(self.body)
        self._thinking = False
        self._tokens: int | None = None
        self._update_label()

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_expanded(self, expanded: bool) -> None:
        self.toggle.setChecked(expanded)

    def set_state(self, thinking: bool, tokens: int | None) -> None:
        """`thinking`: the reasoning is still being written; `tokens`: how many it holds (None: unknown)."""
        if (thinking, tokens) != (self._thinking, self._tokens):
            self._thinking, self._tokens = thinking, tokens
            self._update_label()

    def _update_label(self) -> None:
        arrow = "▾" if self.expanded else "▸"
        words = "Thinking…" if self._thinking else "Thinking"
        count = f" · {self._tokens} tokens" if self._tokens else ""
        self.toggle.setText(f"{arrow} {words}{count}")
        self.toggle.setToolTip("Hide the model's reasoning" if self.expanded else "Show the model's reasoning (kept out of the next turn's prompt)")

    def _on_toggled(self, expanded: bool) -> None:
        self.body.setVisible(expanded)
        self._update_label()
        self.toggled.emit(expanded)

    def set_muted(self, muted: bool) -> None:
        """Quieter text (as Markdown), or the answer's own colour (on the token view's heat colours)."""
        if muted != self._muted:
            self._muted = muted
            self._mute_text()

    def _mute_text(self) -> None:
        """Thoughts read quieter than the answer: the placeholder colour of the current palette."""
        pal = QPalette(self.palette())
        if self._muted:
            pal.setColor(QPalette.ColorRole.Text, pal.color(QPalette.ColorRole.PlaceholderText))
        self.body.setPalette(pal)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == event.Type.PaletteChange:  # light/dark switched
            self._mute_text()

    def paintEvent(self, event: QPaintEvent) -> None:
        # A rule down the left side marks the block as apart from the answer.
        p = QPainter(self)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(self.palette().color(QPalette.ColorRole.Mid))
        p.drawRoundedRect(QRectF(2, 4, 3, max(0, self.height() - 8)), 1.5, 1.5)
        super().paintEvent(event)
