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

The page drawn is a contiguous stretch of the path, in one of two places:

- at the end (the usual case): the path's last `_shown` messages; "Show earlier
  messages" adds `PAGE` above them.
- up the path, around a selected message that was not drawn (a loom node or a
  notebook hit opened far up a long chat): a window from `PAGE // 2` messages
  above it, `PAGE` long, with "Show later messages" below it adding `PAGE` more
  toward the end (and "Show earlier" above). A window that comes within
  2 x `PAGE` of the end simply runs to the end. Drawing everything from the
  selected message down made 3,000 widgets for a 3,000-message chat: 37 s frozen.

When the path changes while a window up the path is shown:

- the path grew at its end (the user sent a turn, an answer is streaming in,
  an import or run appended): the view goes back to the end, last `PAGE`
  messages, stuck to the bottom, so the new message and its answer are seen.
- otherwise (another version chosen with a message's arrows, a branch made or
  regenerated inside the window): the window keeps its top message where it
  still is on the path; once the path ends inside it, it is the end page again.
  If its top message left the path, back to the end.
- a selection made together with the change is drawn in any case: the loom opens
  a node by `Conversation.show` (`path_changed`, whose drawing waits for the loop
  to turn, `_draw_timer`) and then `Selection.set` (`changed`, at once). A
  selected message not drawn is remembered (`_focus`) and placed by the next
  drawing, which is the one waiting, or one made now when nothing waits; the
  other order (selected first, then shown) is placed by that same drawing.
A selection is placed once, when it is made: a later turn, or the token view
turned on, leaves the far-up selected message behind the "Show earlier" button.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QPushButton, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.controllers.chat import ChatController
from app.state.observable import Signal as StateSignal
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.database.write_queue import write_queue
from app.state.settings import Selection, ViewOptions
from app.theme import is_dark
from app.widgets.chat.message_widget import MessageWidget
from app.widgets.chat.undrawable_message import UndrawableMessage
from app.controllers.tool_calls import ToolCallActions

log = logging.getLogger(__name__)

MAX_TEXT_WIDTH = 920  # px: long lines are hard to read on a wide window
PAGE = 20  # messages drawn from the end of a long path; "Show earlier/later messages" adds as many again

Shown = MessageWidget | UndrawableMessage


class ChatView(QScrollArea):
    regenerate_requested = Signal(object)
    continue_requested = Signal(object)
    edit_submitted = Signal(object, str)
    tool_actions: ToolCallActions | None = None  # what call blocks' buttons do (the Tools panel sets it)

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
        self._widgets: list[Shown] = []  # for the page of the path drawn, in order
        self._by_id: dict[int, Shown] = {}
        self._shown = PAGE  # at the end: how many of the path's last messages are drawn
        self._window: tuple[int, int] | None = None  # up the path: (its top message's id, how many); None: the end
        self._focus: int | None = None  # a selected message not drawn yet: the next drawing places a window on it
        self._drawn: tuple[int, Message | None] = (0, None)  # the path's length and last message when last drawn
        self._hidden = (0, 0)  # messages of the path above and below the page drawn
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
        self.later_button = QPushButton()  # below the messages: `_insert` puts them before it
        self.later_button.setAccessibleName("Show later messages")
        self.later_button.setVisible(False)
        self.later_button.clicked.connect(self.show_later)
        self._column.addWidget(self.later_button, 0, Qt.AlignmentFlag.AlignHCenter)
        self._column.addStretch(1)
        self._content.setMaximumWidth(MAX_TEXT_WIDTH)
        self._content.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        holder = QWidget()
        row = self._holder_row = QVBoxLayout(holder)
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
        return self._hidden[0]

    @property
    def later_count(self) -> int:
        """How many later messages of the path are not drawn (behind "Show later messages")."""
        self._draw_now()
        return self._hidden[1]

    def show_earlier(self) -> None:
        """Draw `PAGE` more of the path's earlier messages."""
        self._draw_now()  # a change waiting is placed first: the click acts on what is on screen
        if self._window is not None and self._conv is not None:
            path = self._conv.path()
            top_id, count = self._window
            top = _index(path, top_id)
            if top is not None:
                above = max(0, top - PAGE)
                self._window = (path[above].id, count + top - above)
        else:
            self._shown += PAGE
        self._stick_to_bottom = False
        self._draw_path()

    def show_later(self) -> None:
        """Draw `PAGE` more of the messages below a window up the path (reaching the end: the end page)."""
        self._draw_now()
        if self._window is not None:
            top_id, count = self._window
            self._window = (top_id, count + PAGE)
            self._stick_to_bottom = False
            self._draw_path()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._content.setFixedWidth(min(MAX_TEXT_WIDTH, self.viewport().width()))

    # -- state handlers --------------------------------------------------------------------

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        if self._conv is not None:
            for sig, slot in self._subscriptions(self._conv):
                sig.disconnect(slot)
        self._conv = conv
        self._shown, self._window, self._drawn = PAGE, None, (0, None)
        self._focus = self._selection.message_id  # a message selected already is drawn, wherever it is
        self._clear()
        if conv is not None:
            for sig, slot in self._subscriptions(conv):
                sig.connect(slot)
        self._draw_path()
        self._stick_to_bottom = True

    def _subscriptions(self, conv: Conversation) -> tuple[tuple[StateSignal, Callable[..., None]], ...]:
        return (
            (conv.path_changed, self._on_path_changed),
            (conv.message_changed, self._on_message_changed),
            (conv.tokens_appended, self._on_tokens_appended),
        )

    def _on_path_changed(self) -> None:
        # Drawn when the loop turns: a burst of changes (an import, a loom run's N children) is drawn once.
        if self._window is None:
            self._stick_to_bottom = True  # a window up the path decides when drawn (`_page`)
        if not self._draw_timer.isActive():
            self._draw_timer.start()

    def _draw_now(self) -> None:
        if self._draw_timer.isActive():
            self._draw_path()

    def _draw_path(self) -> None:
        """Make the widgets match the page of the path (`_page`), keeping those that still match."""
        self._draw_timer.stop()
        path = self._conv.path() if self._conv is not None else []
        start, stop = self._page(path)
        wanted = path[start:stop]
        self._drawn = (len(path), path[-1] if path else None)
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
        hidden, below = start, len(path) - stop
        self._hidden = (hidden, below)
        self.earlier_button.setText(f"Show {min(PAGE, hidden)} earlier messages ({hidden} not shown)")
        self.earlier_button.setVisible(hidden > 0)
        self.later_button.setText(f"Show {min(PAGE, below)} later messages ({below} not shown)")
        self.later_button.setVisible(below > 0)
        self._placeholder.setVisible(not self._widgets)

    def _page(self, path: list[Message]) -> tuple[int, int]:
        """The stretch of `path` to draw, [start, stop), after the rules in the module's docstring."""
        n = len(path)
        length, last = self._drawn
        if self._window is not None and 0 < length < n and path[length - 1] is last:
            self._back_to_end()  # the path grew at its end: a new turn, an answer coming in
        start, stop = self._range(path)
        focus, self._focus = self._focus, None
        at = _index(path, focus) if focus is not None and focus == self._selection.message_id else None
        if at is not None and not start <= at < stop:
            top = max(0, at - PAGE // 2)
            if n - top <= 2 * PAGE:
                self._window, self._shown = None, max(self._shown, PAGE, n - top)  # near the end: the end page
            else:
                self._window = (path[top].id, PAGE)
            self._stick_to_bottom = False
            QTimer.singleShot(0, self, lambda: self._reveal(path[at].id))
            start, stop = self._range(path)
        return start, stop

    def _range(self, path: list[Message]) -> tuple[int, int]:
        """Where the page is now: the window up the path, or the end's last `_shown` messages."""
        n = len(path)
        if self._window is not None:
            top_id, count = self._window
            top = _index(path, top_id)
            if top is None:
                self._back_to_end()  # its top message is on a branch no longer shown
            elif top + count < n:
                return top, top + count
            else:
                self._window, self._shown = None, max(PAGE, n - top)  # the path ends inside it: the end page
        return max(0, n - self._shown), n

    def _back_to_end(self) -> None:
        self._window, self._shown = None, PAGE
        self._stick_to_bottom = True

    def _reveal(self, message_id: int) -> None:
        """Scroll the selected message placed by `_page` into view, once its page is laid out."""
        w = self._by_id.get(message_id)
        if w is not None and not self._stick_to_bottom:
            self._holder_row.activate()  # the sizes of a page just drawn, before the loop lays it out
            self.ensureWidgetVisible(w, 0, 0)

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
        self._mark_selected(self._selection.message_id, self._selection.index)  # where it is; no page moved

    def _on_selection_changed(self, message_id: int | None, index: int | None) -> None:
        self._focus = message_id if message_id is not None and message_id not in self._by_id else None
        if (self._focus is not None and not self._draw_timer.isActive() and self._conv is not None
                and _index(self._conv.path(), self._focus) is not None):
            self._draw_path()  # the selected message is outside the page drawn (a drawing waiting places it)
        self._mark_selected(message_id, index)

    def _mark_selected(self, message_id: int | None, index: int | None) -> None:
        for w in list(self._widgets):
            self._guard(w, lambda w: w.set_selected(index if w.message.id == message_id else None))

    def _on_busy_changed(self, busy: bool) -> None:
        for w in list(self._widgets):
            self._guard(w, lambda w: w.set_busy(busy))

    def changeEvent(self, event: QEvent) -> None:
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
        offset = 2  # the placeholder and the "Show earlier messages" button come first, "Show later" after
        self._column.insertWidget(offset + at, w)
        self._widgets.insert(at, w)
        self._by_id[message.id] = w

    def _message_widget(self, message: Message) -> MessageWidget:
        assert self._conv is not None
        w = MessageWidget(self._conv, message)
        w.set_shadows(self._controller.steering_jobs.shadows)
        w.tool_calls.set_actions(self.tool_actions)  # the Tools panel's: a call block's buttons (None: read-only)
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


def _index(path: list[Message], message_id: int | None) -> int | None:
    """Where the message `message_id` is on `path`, or None."""
    return next((i for i, m in enumerate(path) if m.id == message_id), None)
