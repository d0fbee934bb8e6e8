"""The transcript: the visible path of the open conversation, one `MessageWidget` per message.

It follows the state: a new conversation rebuilds it, a changed path keeps
the widgets of the unchanged prefix and rebuilds the rest, streamed tokens go
to the one widget concerned. While the view is scrolled to the bottom it
stays there as an answer grows.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.controller import ChatController
from app.state.conversation import Conversation, Message
from app.state.library import Library
from app.state.settings import Selection, ViewOptions
from app.theme import is_dark
from app.widgets.message_widget import MessageWidget

MAX_TEXT_WIDTH = 920  # px: long lines are hard to read on a wide window


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
        self._widgets: list[MessageWidget] = []
        self._stick_to_bottom = True

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
    def message_widgets(self) -> list[MessageWidget]:
        return list(self._widgets)

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self._widgets if w.message.id == message_id), None)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._content.setFixedWidth(min(MAX_TEXT_WIDTH, self.viewport().width()))

    # -- state handlers --------------------------------------------------------------------

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        if self._conv is not None:
            for sig, slot in self._subscriptions(self._conv):
                sig.disconnect(slot)
        self._conv = conv
        self._clear_from(0)
        if conv is not None:
            for sig, slot in self._subscriptions(conv):
                sig.connect(slot)
            self._on_path_changed()
        self._stick_to_bottom = True

    def _subscriptions(self, conv: Conversation):
        return (
            (conv.path_changed, self._on_path_changed),
            (conv.message_changed, self._on_message_changed),
            (conv.tokens_appended, self._on_tokens_appended),
        )

    def _on_path_changed(self) -> None:
        assert self._conv is not None
        path = self._conv.path()
        keep = 0
        while keep < min(len(path), len(self._widgets)) and self._widgets[keep].message is path[keep]:
            keep += 1
        self._clear_from(keep)
        for message in path[keep:]:
            self._add_widget(message)
        for w in self._widgets[:keep]:
            w.update_chrome()  # sibling counts may have changed
        self._placeholder.setVisible(not self._widgets)
        self._stick_to_bottom = True

    def _on_message_changed(self, message: Message) -> None:
        w = self.widget_for(message.id)
        if w is not None:
            w.refresh()

    def _on_tokens_appended(self, message: Message, _start: int) -> None:
        w = self.widget_for(message.id)
        if w is not None:
            w.on_tokens_appended()

    def _on_view_changed(self) -> None:
        dark = is_dark(self.palette())
        for w in self._widgets:
            w.set_view(self._view.heatmap, self._view.mode, dark)
        self._on_selection_changed(self._selection.message_id, self._selection.index)

    def _on_selection_changed(self, message_id: int | None, index: int | None) -> None:
        for w in self._widgets:
            w.set_selected(index if w.message.id == message_id else None)

    def _on_busy_changed(self, busy: bool) -> None:
        for w in self._widgets:
            w.set_busy(busy)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == event.Type.PaletteChange:
            self._on_view_changed()  # heat colours differ between light and dark

    # -- widgets ---------------------------------------------------------------------------

    def _add_widget(self, message: Message) -> None:
        assert self._conv is not None
        w = MessageWidget(self._conv, message)
        w.set_busy(self._controller.busy)
        w.set_view(self._view.heatmap, self._view.mode, is_dark(self.palette()))
        if message.id == self._selection.message_id:
            w.set_selected(self._selection.index)
        w.regenerate_requested.connect(self.regenerate_requested)
        w.continue_requested.connect(self.continue_requested)
        w.edit_submitted.connect(self.edit_submitted)
        w.sibling_requested.connect(self._on_sibling_requested)
        w.token_clicked.connect(self._on_token_clicked)
        self._column.insertWidget(self._column.count() - 1, w)
        self._widgets.append(w)

    def _clear_from(self, index: int) -> None:
        for w in self._widgets[index:]:
            self._column.removeWidget(w)
            w.deleteLater()
        del self._widgets[index:]

    def _on_sibling_requested(self, message: Message, offset: int) -> None:
        if self._conv is not None and not self._controller.busy:
            self._conv.select_sibling(message, offset)

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
