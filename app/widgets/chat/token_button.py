"""A push button that says 'verb “token”', the token shortened with "…" only to the width the button has.

The inspector's branch button shares its row with "N continuations here": cut to a fixed number of
characters, "␣scattering" read "␣scatteri…" on a 290 px button at 1440 px; whole in a wide dock, it would
push the row wider than a 320 px one. The button takes the row's spare width (its size hint is ignored)
and elides the token to fit it; its least width still shows the verb and "“…”".
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QPushButton, QSizePolicy, QStyle, QStyleOptionButton, QWidget


class TokenButton(QPushButton):
    def __init__(self, text: str, longest_verb: str, parent: QWidget | None = None):
        super().__init__(text, parent)
        self._verb: str | None = None
        self._token = ""
        self._longest_verb = longest_verb
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self._update_minimum()

    def set_plain(self, text: str) -> None:
        """A label with no token in it, shown as it is."""
        self._verb = None
        self.setText(text)

    def set_token(self, verb: str, token: str) -> None:
        """'verb “token”', the token cut to the button's width."""
        self._verb, self._token = verb, token
        self._fit()

    def label(self) -> str:
        """The whole label, before any eliding."""
        return self.text() if self._verb is None else f"{self._verb} “{self._token}”"

    def _padding(self) -> int:
        """The width the style adds around a label (frame, margins): Qt's own size-from-contents."""
        opt = QStyleOptionButton()
        self.initStyleOption(opt)
        opt.text = ""
        return self.style().sizeFromContents(QStyle.ContentsType.CT_PushButton, opt, QSize(0, 0), self).width()

    def _update_minimum(self) -> None:
        self.setMinimumWidth(self._padding() + self.fontMetrics().horizontalAdvance(f"{self._longest_verb} “…”"))

    def _fit(self) -> None:
        if self._verb is None:
            return
        fm = self.fontMetrics()
        room = self.width() - self._padding() - fm.horizontalAdvance(f"{self._verb} “”")
        shown = fm.elidedText(self._token, Qt.TextElideMode.ElideRight, max(room, 0)) or "…"
        self.setText(f"{self._verb} “{shown}”")

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._fit()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() in (event.Type.FontChange, event.Type.StyleChange):
            self._update_minimum()
            self._fit()
