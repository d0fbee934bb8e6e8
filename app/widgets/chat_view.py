"""The transcript: the visible path of the open conversation, one `MessageWidget` per message.

It follows the state: a new conversation rebuilds it, a changed path keeps
the widgets of the unchanged prefix and rebuilds the rest, streamed tokens go
to the one widget concerned. While the view is scrolled to the bottom it
stays there as an answer grows.

Only what can be looked at is drawn. A path change is drawn once the event
loop turns (an import adds thousands of messages in one go: drawing after
each one froze the window for minutes), and a long path shows its last
`PAGE` messages, with a button above them for the earlier ones. A stored
message that cannot be drawn (bad fields from an old or poisoned database)
shows as "cannot show this message (why)" instead of taking the window down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QLabel, QPushButton, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.controllers.chat import ChatController
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.write_queue import write_queue
from app.state.settings import Selection, ViewOptions
from app.theme import is_dark
from app.widgets.message_widget import MessageWidget
from app.widgets.undrawable_message import UndrawableMessage

log = logging.getLogger(__name__)

MAX_TEXT_WIDTH = 920  # px: long lines are hard to read on a wide window
PAGE = 20  # messages drawn from the end of a long path; "Show earlier messages" adds as many again

Shown = MessageWidget | UndrawableMessage


class ChatView(QScrollArea):
    regenerate_requested = Signal(object)
    continue_requested = Signal(object)
    edit_submitted = Signal(object, str)

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
        self._selection = selection
        self._controller = controller
        self._conv: Conversation | None = None
        self._widgets: list[Shown] = []  # for the last messages of the path, in order
        self._by_id: dict[int, Shown] = {}
        self._shown = PAGE  # how many of the path's last messages are drawn
        self._stick_to_bottom = True
        self._draw_timer = QTimer(self, singleShot=True, interval=0)
        self._draw_timer.timeout.connect(self._draw_path)

        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setAccessibleName("Conversation")
        self._content = QWidget()
        self._column = QVBoxLayout(self._content)
        self._column.setContentsMargins(16, 12, 16, 12)
        self._column.setSpacing(10)
        self._placeholder = QLabel(
            "<p style='font-size:15px'><b>Ask the model something.</b></p>"
            "<p>Every token it writes keeps its probability, its alternatives and what each "
            "sampler stage did.<br>Turn on the token view (Ctrl+H) and click a token to inspect it or "
            "branch from one of its alternatives.</p>"
        )
        self._placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._placeholder.setWordWrap(True)
        self._placeholder.setForegroundRole(self._placeholder.foregroundRole().PlaceholderText)
        self._column.addWidget(self._placeholder)
        self.earlier_button = QPushButton()
        self.earlier_button.setAccessibleName("Show earlier messages")
        self.earlier_button.setVisible(False)
        self.earlier_button.clicked.connect(self.show_earlier)
        self._column.addWidget(self.earlier_button, 0, Qt.AlignmentFlag.AlignHCenter)
        self._column.addStretch(1)
        self._content.setMaximumWidth(MAX_TEXT_WIDTH)
        self._content.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        holder = QWidget()
        row = QVBoxLayout(holder)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self._content, 0, Qt.AlignmentFlag.AlignHCenter)
        self.setWidget(holder)

        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

        library.current_changed.connect(self._on_conversation_changed)
        view.changed.connect(self._on_view_changed)
        selection.changed.connect(self._on_selection_changed)
        controller.busy_changed.connect(self._on_busy_changed)
        self._on_conversation_changed(library.current)

    @property
    def message_widgets(self) -> list[Shown]:
        """The drawn messages, in order (drawn now if a path change is waiting)."""
        self._draw_now()
        return list(self._widgets)

    def widget_for(self, message_id: int) -> Shown | None:
        self._draw_now()
        return self._by_id.get(message_id)

    @property
    def hidden_count(self) -> int:
        """How many earlier messages of the path are not drawn (behind "Show earlier messages")."""
        self._draw_now()
        return len(self._conv.path()) - len(self._widgets) if self._conv is not None else 0

    def show_earlier(self) -> None:
        """Draw `PAGE` more of the path's earlier messages."""
        self._shown += PAGE
        self._stick_to_bottom = False
        self._draw_path()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._content.setFixedWidth(min(MAX_TEXT_WIDTH, self.viewport().width()))

    # -- state handlers --------------------------------------------------------------------

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        if self._conv is not None:
            for sig, slot in self._subscriptions(self._conv):
                sig.disconnect(slot)
        self._conv = conv
        self._shown = PAGE
        self._clear()
        if conv is not None:
            for sig, slot in self._subscriptions(conv):
                sig.connect(slot)
        self._draw_path()
        self._stick_to_bottom = True

    def _subscriptions(self, conv: Conversation):
        return (
            (conv.path_changed, self._on_path_changed),
            (conv.message_changed, self._on_message_changed),
            (conv.tokens_appended, self._on_tokens_appended),
        )

    def _on_path_changed(self) -> None:
        # Drawn when the loop turns: a burst of changes (an import, a loom run's N children) is drawn once.
        self._stick_to_bottom = True
        if not self._draw_timer.isActive():
            self._draw_timer.start()

    def _draw_now(self) -> None:
        if self._draw_timer.isActive():
            self._draw_path()

    def _draw_path(self) -> None:
        """Make the widgets match the path's last `_shown` messages, keeping those that still match."""
        self._draw_timer.stop()
        path = self._conv.path() if self._conv is not None else []
        wanted = path[max(0, len(path) - self._shown):]
        if self._selection.message_id is not None and self._conv is not None:
            # The selected message (a loom node opened far up a long chat) is drawn, however far up it is.
            at = next((i for i, m in enumerate(path) if m.id == self._selection.message_id), None)
            if at is not None and at < len(path) - len(wanted):
                self._shown = len(path) - at
                wanted = path[at:]
        place = {id(m): i for i, m in enumerate(wanted)}
        while self._widgets and id(self._widgets[0].message) not in place:
            self._remove(0)  # scrolled out of the page at the top, or no longer on the path
        top = place[id(self._widgets[0].message)] if self._widgets else len(wanted)
        keep = 0
        while (keep < len(self._widgets) and top + keep < len(wanted)
               and self._widgets[keep].message is wanted[top + keep]):
            keep += 1
        while len(self._widgets) > keep:
            self._remove(len(self._widgets) - 1)
        for w in list(self._widgets):
            self._guard(w, lambda w: w.update_chrome())  # sibling counts may have changed
        for i, message in enumerate(wanted[:top]):  # earlier messages, above those kept
            self._insert(i, message)
        for message in wanted[top + keep:]:
            self._insert(len(self._widgets), message)
        hidden = len(path) - len(wanted)
        self.earlier_button.setText(f"Show {min(PAGE, hidden)} earlier messages ({hidden} not shown)")
        self.earlier_button.setVisible(hidden > 0)
        self._placeholder.setVisible(not self._widgets)

    def _on_message_changed(self, message: Message) -> None:
        w = self._by_id.get(message.id)
        if w is not None:
            self._guard(w, lambda w: w.refresh())

    def _on_tokens_appended(self, message: Message, _start: int) -> None:
        w = self._by_id.get(message.id)
        if w is not None:
            self._guard(w, lambda w: w.on_tokens_appended())

    def _on_view_changed(self) -> None:
        dark = is_dark(self.palette())
        for w in list(self._widgets):
            self._guard(w, lambda w: w.set_view(self._view.heatmap, self._view.mode, dark))
        self._on_selection_changed(self._selection.message_id, self._selection.index)

    def _on_selection_changed(self, message_id: int | None, index: int | None) -> None:
        if (message_id is not None and message_id not in self._by_id and self._conv is not None
                and any(m.id == message_id for m in self._conv.path())):
            self._draw_path()  # the selected message is further up than the page drawn
        for w in list(self._widgets):
            self._guard(w, lambda w: w.set_selected(index if w.message.id == message_id else None))

    def _on_busy_changed(self, busy: bool) -> None:
        for w in list(self._widgets):
            self._guard(w, lambda w: w.set_busy(busy))

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == event.Type.PaletteChange:
            self._on_view_changed()  # heat colours differ between light and dark

    # -- widgets ---------------------------------------------------------------------------

    def _insert(self, at: int, message: Message) -> None:
        """Draw `message` as the `at`th widget; one that cannot be drawn says so in one line."""
        assert self._conv is not None
        try:
            w: Shown = self._message_widget(message)
        except Exception as e:  # noqa: BLE001 - a stored message with bad fields must not stop the window
            log.warning("cannot show message %s: %s", message.id, e, exc_info=True)
            w = UndrawableMessage(message, e)
        offset = 2  # the placeholder and the "Show earlier messages" button come first
        self._column.insertWidget(offset + at, w)
        self._widgets.insert(at, w)
        self._by_id[message.id] = w

    def _message_widget(self, message: Message) -> MessageWidget:
        assert self._conv is not None
        w = MessageWidget(self._conv, message)
        w.set_shadows(self._controller.steering_jobs.shadows)
        try:
            w.set_busy(self._controller.busy)
            w.set_view(self._view.heatmap, self._view.mode, is_dark(self.palette()))
            if message.id == self._selection.message_id:
                w.set_selected(self._selection.index)
        except Exception:
            w.deleteLater()
            raise
        w.regenerate_requested.connect(self.regenerate_requested)
        w.continue_requested.connect(self.continue_requested)
        w.edit_submitted.connect(self.edit_submitted)
        w.sibling_requested.connect(self._on_sibling_requested)
        w.token_clicked.connect(self._on_token_clicked)
        return w

    def _guard(self, w: Shown, action: Callable[[Shown], None]) -> None:
        """Run `action` on a drawn message; if it raises, the message is shown as one that cannot be drawn."""
        try:
            action(w)
        except Exception as e:  # noqa: BLE001 - one bad message must not break the transcript
            log.warning("cannot show message %s: %s", w.message.id, e, exc_info=True)
            if w in self._widgets:
                at = self._widgets.index(w)
                self._remove(at)
                bad = UndrawableMessage(w.message, e)
                self._column.insertWidget(2 + at, bad)
                self._widgets.insert(at, bad)
                self._by_id[bad.message.id] = bad

    def _remove(self, at: int) -> None:
        w = self._widgets.pop(at)
        self._by_id.pop(w.message.id, None)
        self._column.removeWidget(w)
        w.deleteLater()

    def _clear(self) -> None:
        while self._widgets:
            self._remove(len(self._widgets) - 1)

    def _on_sibling_requested(self, message: Message, offset: int) -> None:
        if self._conv is not None and not self._controller.busy:
            conv = self._conv  # another connection holding the write lock: done once it is free (write_queue.py)
            write_queue(self._library.store).run("showing another version", lambda: conv.select_sibling(message, offset),
                                                  atomic=False)

    def _on_token_clicked(self, message: Message, index: int) -> None:
        self._selection.set(message.id, index)

    # -- scrolling -------------------------------------------------------------------------

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick_to_bottom = value >= bar.maximum() - 4

    def _on_range_changed(self, _lo: int, hi: int) -> None:
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(hi)

    def scroll_to_bottom(self) -> None:
        self._stick_to_bottom = True
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())
