"""Step mode's panel: the distribution the answer waits on, and the user's pick from it.

Enter takes the sampler's pick; 1–9 take the model's nth most likely token;
a double-click on a row takes that one. Leaving step mode lets the
model go on by itself.
"""

from __future__ import annotations

from engine import TokenEvent
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QCheckBox, QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from app.controllers.loom import LoomController
from app.widgets.fmt import pct, visible

STEP_TIP = ("Pause the next answers after every token's distribution: Enter takes the sampler's pick, 1–9 the "
            "nth most likely token. Untick to let the model go on.")


class StepPanel(QWidget):
    def __init__(self, loom: LoomController, parent: QWidget | None = None):
        super().__init__(parent)
        self._loom = loom
        self._waiting: TokenEvent | None = None
        self.toggle = QCheckBox("Step mode (pick every token)")
        self.toggle.setToolTip(STEP_TIP)
        self.toggle.setAccessibleName("Step mode")
        self.toggle.toggled.connect(loom.set_stepping)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # it quotes the token the sampler would take
        self.label.setWordWrap(True)
        self.choices = QListWidget()
        self.choices.setAccessibleName("Next token choices")
        self.choices.itemActivated.connect(self._on_activated)
        self.choices.installEventFilter(self)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.toggle)
        lay.addWidget(self.label)
        lay.addWidget(self.choices, 1)
        loom.step_waiting.connect(self._on_waiting)
        loom.stepping_changed.connect(self._on_stepping_changed)
        # An answer stopped (or ended) while a distribution waited: that list answers nothing any more.
        loom.chat.busy_changed.connect(lambda busy: None if busy else self._show_idle())
        self._show_idle()

    @property
    def waiting(self) -> TokenEvent | None:
        return self._waiting

    def _show_idle(self) -> None:
        self._waiting = None
        self.choices.clear()
        self.choices.setEnabled(False)
        on = self._loom.stepping
        self.label.setText("The next answer pauses after every distribution." if on else "")
        self.choices.setVisible(on)

    def _on_stepping_changed(self, on: bool) -> None:
        if self.toggle.isChecked() != on:
            self.toggle.setChecked(on)
        self._show_idle()

    def _on_waiting(self, preview: TokenEvent) -> None:
        self._waiting = preview
        self.choices.setVisible(True)
        self.choices.setEnabled(True)
        self.choices.clear()
        for n, alt in enumerate(p for p in preview.top_model if not p.is_rest):
            mark = "  ← sampler" if alt.token_id == preview.token_id else ""
            key = f"{n + 1}" if n < 9 else "  "
            item = QListWidgetItem(f"{key}  {visible(alt.text)}   {pct(alt.prob)}{mark}")
            item.setData(Qt.ItemDataRole.UserRole, alt.token_id)
            self.choices.addItem(item)
        self.label.setText(f"Token {preview.index + 1}: the sampler would take “{visible(preview.token_text)}”. "
                           "Enter takes it; 1–9 the nth; or click one.")
        self.choices.setFocus()

    def take(self, token_id: int | None) -> None:
        """Answer the waiting distribution (None: the sampler's pick)."""
        if self._waiting is None:
            return
        self._loom.pick(token_id)
        self._show_idle()

    def take_nth(self, n: int) -> None:
        """Take the model's nth most likely token (1-based) of the waiting distribution."""
        if self._waiting is None:
            return
        alts = [p for p in self._waiting.top_model if not p.is_rest]
        if 1 <= n <= len(alts):
            self.take(alts[n - 1].token_id)

    def _on_activated(self, item: QListWidgetItem) -> None:
        self.take(int(item.data(Qt.ItemDataRole.UserRole)))

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if obj is self.choices and isinstance(event, QKeyEvent) and event.type() == QKeyEvent.Type.KeyPress:
            key = event.key()
            if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                self.take(None)
                return True
            if Qt.Key.Key_1 <= key <= Qt.Key.Key_9:
                self.take_nth(key - Qt.Key.Key_0)
                return True
        return super().eventFilter(obj, event)
