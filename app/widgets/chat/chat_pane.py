"""The middle of the window: title and system prompt, the token-view bar, the transcript, the composer."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers.chat import ChatController
from app.state.conversation import Conversation
from app.state.conversation_list import Library
from app.state.database.write_queue import write_queue
from app.state.settings import HEAT_MODES, Selection, ViewOptions
from app.widgets.chat.chat_view import ChatView
from app.widgets.chat.composer import Composer
from app.widgets.heat import MODE_LABELS, HeatLegend


SYSTEM_PLACEHOLDER = "System prompt for this conversation (optional), e.g. “Answer briefly.”"
SYSTEM_TIP = "The system prompt of this conversation"


TITLE_MIN_CHARS = 16  # the header keeps this many characters of the title on its row, else the controls move down


class ElidedLabel(QLabel):
    """A bold one-line label that shortens its text with "…" instead of pushing its neighbours away."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)  # a conversation's title is text, never markup
        font = self.font()
        font.setBold(True)
        self.setFont(font)
        # Ignored: the layout may make it as narrow as it likes; paintEvent elides.
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def paintEvent(self, _event: QPaintEvent) -> None:
        p = QPainter(self)
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.width())
        p.drawText(self.rect(), int(Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft), text)


class ChatPane(QWidget):
    def __init__(
        self,
        library: Library,
        view: ViewOptions,
        selection: Selection,
        controller: ChatController,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self._library = library
        self._view = view
        self._conv: Conversation | None = None

        self._build_title_and_system()
        self._build_token_view_controls()
        head = self._build_header_rows()

        self.chat_view = ChatView(library, view, selection, controller)
        self.composer = Composer()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        lay.addLayout(head)
        lay.addLayout(self._controls_row)
        sys_row = QHBoxLayout()
        sys_row.setContentsMargins(16, 0, 12, 0)
        sys_row.addWidget(self.system_edit)
        lay.addLayout(sys_row)
        lay.addWidget(self.chat_view, 1)
        lay.addWidget(self.composer)

        controller.busy_changed.connect(self.composer.set_busy)
        library.current_changed.connect(self._on_conversation_changed)
        view.changed.connect(self._on_view_changed)
        self._on_view_changed()
        self._on_conversation_changed(library.current)

    def _build_title_and_system(self) -> None:
        """The conversation's title, and the system prompt's button and box (saved after a pause in typing)."""
        self.title_label = ElidedLabel()
        self.title_label.setAccessibleName("Conversation title")
        self.system_button = QToolButton()
        self.system_button.setCheckable(True)
        self.system_button.setAutoRaise(True)
        self.system_button.setAccessibleName("Show system prompt")
        self.system_button.setToolTip(SYSTEM_TIP)
        self.system_edit = QPlainTextEdit()
        self.system_edit.setAccessibleName("System prompt")
        self.system_edit.setPlaceholderText(SYSTEM_PLACEHOLDER)
        self.system_edit.setFixedHeight(self.fontMetrics().lineSpacing() * 3 + 12)
        self.system_edit.setVisible(False)
        self.system_button.toggled.connect(self.system_edit.setVisible)
        self._system_timer = QTimer(self)
        self._system_timer.setSingleShot(True)
        self._system_timer.setInterval(500)
        self._system_timer.timeout.connect(self._save_system_prompt)
        self.system_edit.textChanged.connect(self._system_timer.start)

    def _build_token_view_controls(self) -> None:
        """Token view's switch, the measure it colours by, and the colours' legend."""
        self.heat_toggle = QCheckBox("Token view")
        self.heat_toggle.setAccessibleName("Token heatmap")
        self.heat_toggle.setToolTip("Show the answer as tokens coloured by the chosen measure (Ctrl+H)")
        self.mode_box = QComboBox()
        self.mode_box.setAccessibleName("Colour tokens by")
        for mode in HEAT_MODES:
            self.mode_box.addItem(MODE_LABELS[mode], mode)
        # The box may show fewer characters than its longest measure (its list shows them all): on a small
        # screen the header row set the window's minimum width.
        self.mode_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.mode_box.setMinimumContentsLength(6)
        self.legend = HeatLegend(self._view.mode)
        self.heat_toggle.toggled.connect(self._view.set_heatmap)
        self.mode_box.currentIndexChanged.connect(lambda i: self._view.set_mode(self.mode_box.itemData(i)))

    def _build_header_rows(self) -> QHBoxLayout:
        """The title's row (returned) and the controls' row below it."""
        # The title and the token-view controls share a row where the chat is wide; where it is narrow (the
        # chat column at 1024x700) the controls get a row of their own below the title (`_arrange_header`):
        # sharing one, the title was squeezed to nothing and the legend with it.
        # They start on the second row, whose least width is the smaller: a window sized before its first
        # layout is never held wider than the screen by a row it then leaves.
        head = QHBoxLayout()
        head.setContentsMargins(16, 8, 12, 0)
        head.addWidget(self.title_label, 1)
        head.addSpacing(8)
        head.addWidget(self.system_button)
        self._head = head
        self._by_label = QLabel("by")
        self._header_controls = (self.heat_toggle, self._by_label, self.mode_box, self.legend)
        self._controls_row = QHBoxLayout()
        self._controls_row.setContentsMargins(16, 0, 12, 0)
        for w in self._header_controls:
            self._controls_row.addWidget(w)
        self._controls_row.addStretch(1)
        self._two_rows = True
        return head

    def _header_width(self) -> int:
        """The width one header row needs for a readable title and every control whole."""
        shown = [w for w in self._header_controls if not w.isHidden()]
        spacing = max(0, self._head.spacing())
        margins = self._head.contentsMargins()
        title = self.title_label.fontMetrics().horizontalAdvance("x" * TITLE_MIN_CHARS)
        return (margins.left() + margins.right() + title + sum(w.sizeHint().width() for w in shown) + 8
                + self.system_button.sizeHint().width() + spacing * (len(shown) + 2))

    def _arrange_header(self) -> None:
        """One header row where it fits, else the token-view controls on a second row (known once laid out)."""
        if not self.isVisible():
            return
        two = self.width() < self._header_width()
        if two == self._two_rows:
            return
        self._two_rows = two
        for i, w in enumerate(self._header_controls):
            (self._head if two else self._controls_row).removeWidget(w)
            if two:
                self._controls_row.insertWidget(i, w)
            else:
                self._head.insertWidget(1 + i, w)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._arrange_header()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        """As narrow as one header row's controls allow, whichever row they are on: the window's least width
        (and so how it fits a small screen) does not change when they move."""
        hint = super().minimumSizeHint()
        shown = [w for w in self._header_controls if not w.isHidden()]
        margins = self._head.contentsMargins()
        one_row = (margins.left() + margins.right() + sum(w.minimumSizeHint().width() for w in shown) + 8
                   + self.system_button.minimumSizeHint().width() + max(0, self._head.spacing()) * (len(shown) + 2))
        return QSize(max(hint.width(), one_row), hint.height())

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        self._system_timer.stop()
        if self._conv is not None:
            self._save_system_prompt()
            self._conv.changed.disconnect(self._on_conversation_edited)
        self._conv = conv
        if conv is not None:
            conv.changed.connect(self._on_conversation_edited)
        self._on_conversation_edited()

    def _on_conversation_edited(self) -> None:
        conv = self._conv
        self.title_label.setText(conv.title if conv else "")
        prompt = conv.system_prompt if conv else ""
        if self.system_edit.toPlainText() != prompt:
            self.system_edit.blockSignals(True)
            self.system_edit.setPlainText(prompt)
            self.system_edit.blockSignals(False)
        # "System", not "System prompt": the header row sets the chat's least width (and so the window's).
        self.system_button.setText("System ●" if prompt.strip() else "System")

    def set_template_default(self, text: str) -> None:
        """What the model's chat template says in place of an empty system prompt ("" when nothing): shown
        in the empty box, so that what the model is told is not hidden."""
        if text:
            # Short: the box is three lines high; its tooltip and the button's say it in full.
            self.system_edit.setPlaceholderText(f"Empty — the chat template adds: “{text}”")
            self.system_edit.setToolTip(f"When this is empty, the model's chat template adds its own system prompt: "
                                        f"“{text}”. Type here to replace it.")
            self.system_button.setToolTip(f"{SYSTEM_TIP}; when empty, the chat template adds “{text}”")
        else:
            self.system_edit.setPlaceholderText(SYSTEM_PLACEHOLDER)
            self.system_edit.setToolTip("")
            self.system_button.setToolTip(SYSTEM_TIP)
        self.system_edit.viewport().update()  # Qt left the old placeholder on screen (seen under X11)

    def _save_system_prompt(self) -> None:
        if self._conv is not None:
            conv, text = self._conv, self.system_edit.toPlainText()  # a busy database: written once it is free
            write_queue(self._library.store).run("saving the system prompt", lambda: conv.set_system_prompt(text))

    def _on_view_changed(self) -> None:
        self.heat_toggle.blockSignals(True)
        self.heat_toggle.setChecked(self._view.heatmap)
        self.heat_toggle.blockSignals(False)
        self.mode_box.blockSignals(True)
        self.mode_box.setCurrentIndex(HEAT_MODES.index(self._view.mode))
        self.mode_box.blockSignals(False)
        self.legend.set_mode(self._view.mode)
        self.mode_box.setEnabled(self._view.heatmap)
        self.legend.setVisible(self._view.heatmap)
        self._arrange_header()
