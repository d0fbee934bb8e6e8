"""The notebook: one editable text the model continues, its generated parts coloured token by token.

It shows `app.state.notebook.notebook_text` of the open notebook and follows the
state as the chat view does (a streamed token appends to the text; a new path
replaces it). The parts the model wrote are tinted, or coloured per token by
the chosen heatmap measure; a click on one of their tokens selects it for the
inspector, from where any token can be branched from, as in a chat answer.
What the person types stays in the editor until it is applied
(`app.state.notebook.apply_text`): on Generate, when the editor loses focus, when
another version is shown and when another conversation is opened, so an edit
is never lost and never makes a version per keystroke. The view never starts
a generation itself: it asks with `generate_requested`.
"""

from __future__ import annotations

import bisect
import os

from collections.abc import Callable

from engine import TokenEvent
from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFocusEvent, QFont, QMouseEvent, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QTextEdit, QToolButton, QToolTip, QVBoxLayout, QWidget,
)

from app.controllers.chat import ChatController
from app.state.notebook import apply_text, is_notebook, notebook_text, spans
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.observable import Signal as ObservableSignal
from app.state.database.write_queue import write_queue
from app.state.settings import Selection, ViewOptions
from app.theme import is_dark
from app.widgets.chat.chat_pane import ElidedLabel
from app.widgets.fmt import token_tooltip
from app.widgets.heat import HeatLegend, confidence, heat_color
from app.widgets.chat.markup_tokens import MarkupTokens

# Streaming follows the end while the view is this close to it (a QPlainTextEdit scrolls by lines); scrolled
# further up, the person is reading: the view stays put.
FOLLOW_SLACK_LINES = 1
PLACEHOLDER = (
    "Write the beginning of a text — a story, a letter, a list, code — and press Generate (Ctrl+Enter): the model "
    "continues it. No chat template is applied: the model sees exactly this text, which is how a base model is used."
)


class NotebookEditor(QPlainTextEdit):
    """The text; tells which character was clicked (not a drag) and when the person leaves it."""

    clicked = Signal(int)  # document position
    hovered = Signal(int, object)  # document position, global point
    left = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setAccessibleName("Notebook text")
        self.setPlaceholderText(PLACEHOLDER)
        font = self.font()
        font.setPointSizeF(font.pointSizeF() * 1.1)
        self.setFont(font)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton and not self.textCursor().hasSelection():
            self.clicked.emit(self.character_at(event.position().toPoint()))

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        super().mouseMoveEvent(event)
        self.hovered.emit(self.character_at(event.position().toPoint()), event.globalPosition().toPoint())

    def character_at(self, point: QPoint) -> int:
        """The document position of the character under `point` (viewport coordinates).

        `cursorForPosition` gives the nearest boundary between characters: on a character's right half that is
        the position after it, so a click there selected the next token (a one-character token such as "."
        could not be clicked on its right half at all). The character before that boundary is the one under
        the point when the point lies between its two edges on the same line (either text direction).
        """
        cursor = self.cursorForPosition(point)
        position = cursor.position()
        if position > cursor.block().position():
            before = QTextCursor(cursor)
            before.setPosition(position - 1)
            left, right = self.cursorRect(before), self.cursorRect(cursor)
            if left.top() == right.top() and min(left.left(), right.left()) <= point.x() < max(left.left(), right.left()):
                return position - 1
        return position

    def focusOutEvent(self, event: QFocusEvent) -> None:
        super().focusOutEvent(event)
        self.left.emit()


class NotebookView(QWidget):
    generate_requested = Signal(str)  # the editor's text: apply it and continue it
    stop_requested = Signal()

    def __init__(self, library: Library, view: ViewOptions, selection: Selection, controller: ChatController,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self._library, self._view, self._selection, self._controller = library, view, selection, controller
        self._conv: Conversation | None = None
        self._synced = ""  # the state's text as last put in the editor: anything else there is the person's draft
        self._starts: list[int] = []  # document position where each generated token begins
        self._tokens: list[tuple[Message, int, int]] = []  # (part, token index, end position), parallel to _starts
        # The model's special tokens (<start_of_image>) are drawn as markup, as the chat's token view draws them.
        self._markup = MarkupTokens(controller.host, self)
        self._markup.ready.connect(self._paint)

        head = self._build_head()

        self.editor = NotebookEditor()
        self.editor.clicked.connect(self._on_clicked)
        self.editor.hovered.connect(self._on_hovered)
        self.editor.left.connect(self.commit_draft)
        self.editor.cursorPositionChanged.connect(self._update_versions)

        foot = self._build_foot()

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)
        lay.addLayout(head)
        body = QHBoxLayout()
        body.setContentsMargins(16, 0, 12, 0)
        body.addWidget(self.editor)
        lay.addLayout(body, 1)
        lay.addLayout(foot)

        self._sync_timer = QTimer(self)  # streamed tokens: one repaint per frame, not per token
        self._sync_timer.setSingleShot(True)
        self._sync_timer.setInterval(30)
        self._sync_timer.timeout.connect(self._sync)
        library.current_changed.connect(self._on_conversation_changed)
        view.changed.connect(self._on_view_changed)
        selection.changed.connect(lambda *_: self._paint())
        controller.busy_changed.connect(self._on_busy)
        self._on_view_changed()
        self._on_busy(controller.busy)
        self._on_conversation_changed(library.current)

    def _build_head(self) -> QHBoxLayout:
        """The title, the note that no chat template wraps the text, token view's switch and its legend."""
        self.title_label = ElidedLabel()  # bold, and shortened rather than widening the window
        self.title_label.setAccessibleName("Notebook title")
        self.mode_note = QLabel("Notebook · no chat template")
        self.mode_note.setToolTip("The model continues this text as it is: nothing is wrapped around it")
        self.mode_note.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.heat_toggle = QCheckBox("Token view")
        self.heat_toggle.setAccessibleName("Token heatmap")
        self.heat_toggle.setToolTip("Colour the model's tokens by the chosen measure (Ctrl+H); the chat's choice")
        self.heat_toggle.toggled.connect(self._view.set_heatmap)
        self.legend = HeatLegend(self._view.mode)
        head = QHBoxLayout()
        head.setContentsMargins(16, 8, 12, 0)
        head.addWidget(self.title_label, 1)
        head.addWidget(self.mode_note)
        head.addSpacing(12)
        head.addWidget(self.heat_toggle)
        head.addWidget(self.legend)
        return head

    def _build_foot(self) -> QHBoxLayout:
        """The part at the cursor's versions with their arrows, Stop and Generate."""
        self.version_label = QLabel()
        self.version_label.setTextFormat(Qt.TextFormat.PlainText)
        self.version_label.setAccessibleName("Version of the part at the cursor")
        self.previous_button = QToolButton()
        self.previous_button.setText("‹")
        self.previous_button.setAccessibleName("Previous version")
        self.next_button = QToolButton()
        self.next_button.setText("›")
        self.next_button.setAccessibleName("Next version")
        self.previous_button.clicked.connect(lambda: self._show_version(-1))
        self.next_button.clicked.connect(lambda: self._show_version(+1))
        self.generate_button = QPushButton("Generate")
        self.generate_button.setToolTip("Continue the text (Ctrl+Enter)")
        self.generate_button.setDefault(True)
        self.generate_button.clicked.connect(self.request_generate)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop_requested.emit)
        foot = QHBoxLayout()
        foot.setContentsMargins(16, 0, 12, 8)
        foot.addWidget(self.previous_button)
        foot.addWidget(self.version_label)
        foot.addWidget(self.next_button)
        foot.addStretch(1)
        foot.addWidget(self.stop_button)
        foot.addWidget(self.generate_button)
        return foot

    # -- following the state ---------------------------------------------------------------

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        old = self._conv
        if old is not None:
            self.commit_draft()
            for signal, slot in self._subscriptions(old):
                signal.disconnect(slot)
        self._conv = conv if is_notebook(conv) else None
        if self._conv is not None:
            for signal, slot in self._subscriptions(self._conv):
                signal.connect(slot)
        self._on_title()
        self._sync(force=True)

    def _subscriptions(self, conv: Conversation) -> tuple[tuple[ObservableSignal, Callable[..., None]], ...]:
        return ((conv.changed, self._on_title), (conv.path_changed, self._on_path_changed),
                (conv.message_changed, self._on_part_changed), (conv.tokens_appended, self._on_part_changed))

    def _on_title(self) -> None:
        self.title_label.setText(self._conv.title if self._conv is not None else "")

    def _on_path_changed(self) -> None:
        self._sync(force=True)

    def _on_part_changed(self, *_args: object) -> None:
        self._sync_timer.start()

    def _sync(self, force: bool = False) -> None:
        """Bring the editor to the state's text; a draft the person is typing is kept unless `force`."""
        self._sync_timer.stop()
        text = notebook_text(self._conv) if self._conv is not None else ""
        current = self.editor.toPlainText()
        if current != text and (force or current == self._synced):
            if text.startswith(current):  # streaming: append, keeping the cursor and the scroll position
                bar = self.editor.verticalScrollBar()
                following = bar.value() >= bar.maximum() - FOLLOW_SLACK_LINES  # at the end: follow it, as a terminal does
                cursor = QTextCursor(self.editor.document())
                cursor.movePosition(QTextCursor.MoveOperation.End)
                cursor.insertText(text[len(current):])
                if following:
                    bar.setValue(bar.maximum())
            else:
                self.editor.setPlainText(text)
        self._synced = text
        self._paint()
        self._update_versions()

    # -- the person's draft ----------------------------------------------------------------

    @property
    def draft(self) -> str:
        return self.editor.toPlainText()

    def commit_draft(self) -> None:
        """Apply what was typed to the notebook (keeping every version), unless a generation is running."""
        if self._conv is None or self._conv.deleted or self._controller.busy or self.draft == self._synced:
            return
        if not self.draft and not self._conv.messages:
            return
        conv, draft = self._conv, self.draft

        def apply() -> None:
            apply_text(conv, draft)
            if conv is self._conv:
                self._synced = notebook_text(conv)

        # Another connection holding the write lock: applied once it is free, in order (app/state/database/write_queue.py).
        write_queue(self._library.store).run("saving the notebook's text", apply)

    def request_generate(self) -> None:
        if self._conv is not None and not self._controller.busy:
            self.generate_requested.emit(self.draft)

    # -- colours and tokens ----------------------------------------------------------------

    def _on_view_changed(self) -> None:
        self.heat_toggle.blockSignals(True)
        self.heat_toggle.setChecked(self._view.heatmap)
        self.heat_toggle.blockSignals(False)
        self.legend.set_mode(self._view.mode)
        self.legend.setVisible(self._view.heatmap)
        self._paint()

    def _paint(self) -> None:
        """Colour the generated parts (token by token in the token view) and the selected token."""
        self._starts, self._tokens = [], []
        conv = self._conv
        if conv is None:
            self.editor.setExtraSelections([])
            return
        intact = len(os.path.commonprefix([self.editor.toPlainText(), self._synced]))  # a draft shifts what follows
        dark, heat, mode = is_dark(self.palette()), self._view.heatmap, self._view.mode
        tint = self.palette().color(QPalette.ColorRole.AlternateBase)
        selections = []
        for part, start in spans(conv):
            if not part.is_assistant:
                continue
            position = start
            for i, ev in enumerate(conv.tokens(part)):
                end = position + len(ev.text)
                if end > intact:
                    break
                if end > position:
                    self._starts.append(position)
                    self._tokens.append((part, i, end))
                    selected = self._selection.message_id == part.id and self._selection.index == i
                    selections.append(self._selection_for(position, end, ev, heat_color(confidence(ev, mode), dark)
                                                          if heat else tint, selected))
                position = end
        self.editor.setExtraSelections(selections)

    def _selection_for(self, start: int, end: int, ev: TokenEvent, background: QColor, selected: bool) -> QTextEdit.ExtraSelection:
        sel = QTextEdit.ExtraSelection()
        sel.cursor = QTextCursor(self.editor.document())
        sel.cursor.setPosition(start)
        sel.cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        fmt = QTextCharFormat()
        if selected:
            fmt.setBackground(self.palette().color(QPalette.ColorRole.Highlight))
            fmt.setForeground(self.palette().color(QPalette.ColorRole.HighlightedText))
            fmt.setFontWeight(QFont.Weight.Bold)
        else:
            fmt.setBackground(background)
        if ev.forced:
            fmt.setFontUnderline(True)
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DashUnderline)
        if self._markup.is_markup(ev):  # not letters the model wrote: greyed and slanted, as in the chat
            fmt.setFontItalic(True)
            if not selected:
                fmt.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        sel.format = fmt
        return sel

    def token_at(self, position: int) -> tuple[Message, int] | None:
        """The generated token at document `position` (the character after it), or None."""
        k = bisect.bisect_right(self._starts, position) - 1
        if 0 <= k < len(self._tokens) and position < self._tokens[k][2]:
            part, index, _end = self._tokens[k]
            return part, index
        return None

    def token_position(self, message_id: int, index: int) -> int:
        """Where token `index` of part `message_id` begins in the document (tests click there)."""
        for start, (part, i, _end) in zip(self._starts, self._tokens):
            if part.id == message_id and i == index:
                return start
        raise KeyError((message_id, index))

    def _on_clicked(self, position: int) -> None:
        hit = self.token_at(position)
        if hit is not None:
            self._selection.set(hit[0].id, hit[1])

    def _on_hovered(self, position: int, where: QPoint) -> None:
        hit = self.token_at(position)
        if hit is None:
            QToolTip.hideText()
        elif self._conv is not None:
            QToolTip.showText(where, token_tooltip(self._conv.tokens(hit[0])[hit[1]]), self.editor.viewport())

    # -- versions --------------------------------------------------------------------------

    def part_at_cursor(self) -> Message | None:
        if self._conv is None:
            return None
        position = self.editor.textCursor().position()
        chosen = None
        for part, start in spans(self._conv):
            if start <= position:
                chosen = part
        return chosen

    def _update_versions(self) -> None:
        part = self.part_at_cursor()
        sibs = self._conv.siblings(part) if part is not None and self._conv is not None else []
        k: int | None = None  # the part's place among its versions, when it has more than one
        if part is not None and len(sibs) > 1:
            k = sibs.index(part)
            who = "model's" if part.is_assistant else "your"
            self.version_label.setText(f"{who} part at the cursor: version {k + 1} / {len(sibs)}")
        else:
            self.version_label.setText("")
        self.previous_button.setVisible(k is not None)
        self.next_button.setVisible(k is not None)
        self.previous_button.setEnabled(k is not None and k > 0 and not self._controller.busy)
        self.next_button.setEnabled(k is not None and k < len(sibs) - 1 and not self._controller.busy)

    def _show_version(self, offset: int) -> None:
        self.commit_draft()
        part = self.part_at_cursor()
        if part is not None and self._conv is not None:
            position = self.editor.textCursor().position()
            conv = self._conv  # another connection holding the write lock: done once it is free (write_queue.py)
            write_queue(self._library.store).run("showing another version", lambda: conv.select_sibling(part, offset),
                                                  atomic=False)
            cursor = self.editor.textCursor()
            cursor.setPosition(min(position, len(self.editor.toPlainText())))
            self.editor.setTextCursor(cursor)
            self._update_versions()

    def _on_busy(self, busy: bool) -> None:
        if not busy and self._conv is not None:
            self._sync()  # the last tokens, without waiting for the frame timer
        self.editor.setReadOnly(busy)
        self.generate_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self._update_versions()
