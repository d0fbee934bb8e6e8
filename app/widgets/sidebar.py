"""The list of conversations: search, new, rename, delete; the open one is selected."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.state.conversation_list import Library
from app.state.write_queue import write_queue

ID_ROLE = Qt.ItemDataRole.UserRole


def _when(ts: float) -> str:
    age = time.time() - ts
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return time.strftime("%H:%M", time.localtime(ts))
    return time.strftime("%d %b", time.localtime(ts))


BUTTON_PADDING = 24  # px beside a button's text, enough for the style's bevel and margins


class Sidebar(QWidget):
    new_requested = Signal()
    delete_requested = Signal(int)  # conversation id (the window stops a generation streaming into it first)

    def __init__(self, library: Library, parent: QWidget | None = None):
        super().__init__(parent)
        self._library = library
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations")
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        # Long titles are elided, not scrolled to.
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.new_button = QPushButton("New")  # short: the three buttons' row sets the panel's least width
        self.new_button.setAccessibleName("New conversation")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.rename_button = QPushButton("Rename")
        self.rename_button.setAccessibleName("Rename conversation")
        self.rename_button.setToolTip("Rename the selected conversation (F2)")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setAccessibleName("Delete conversation")

        # A push button asks for 80 px whatever its text; these three, so wide, set the panel's least width
        # (and with it the window's): they may shrink to their text.
        for button in (self.new_button, self.rename_button, self.delete_button):
            button.setMinimumWidth(button.fontMetrics().horizontalAdvance(button.text()) + BUTTON_PADDING)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button, 1)
        buttons.addWidget(self.rename_button)
        buttons.addWidget(self.delete_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        lay.addLayout(buttons)

        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(150)
        self._search_timer.timeout.connect(lambda: self._reload())
        self.search.textChanged.connect(self._search_timer.start)
        self.list.currentItemChanged.connect(self._on_current_item_changed)
        # Rename and Delete follow the selection however it changes: a click, a reload, or the
        # library opening a conversation (the last one, at start) while the list is being filled.
        self.list.currentItemChanged.connect(self._update_buttons)
        self.list.itemChanged.connect(self._on_item_renamed)
        self.new_button.clicked.connect(self.new_requested)
        self.rename_button.clicked.connect(self.begin_rename)
        self.delete_button.clicked.connect(self._on_delete_clicked)

        # Reloads are deferred to the event loop: a rename or a click can trigger one from inside
        # the list's own signal handler, where clearing the list would delete the item in use.
        self._reload_timer = QTimer(self)
        self._reload_timer.setSingleShot(True)
        self._reload_timer.setInterval(0)
        self._reload_timer.timeout.connect(self._reload)
        library.list_changed.connect(self._schedule_reload)
        library.current_changed.connect(self._on_current_changed)
        self._filling = False
        self._reload()

    def _schedule_reload(self) -> None:
        self._reload_timer.start()

    def _reload(self) -> None:
        if self._library.store.closed:  # a search or reload timer that fires after the window closed the database
            return
        self._filling = True
        self.list.clear()
        current = self._library.current.id if self._library.current else None
        for row in self._library.summaries(self.search.text()):
            item = QListWidgetItem(row.title)
            item.setData(ID_ROLE, row.id)
            kind = "notebook (text the model continues)" if row.mode == "notebook" else "chat"
            if row.served:  # a client's request to Model ▸ Serve…: marked with a network icon
                kind = f"served to {row.served.get('client') or 'a client'} (Model ▸ Serve…), as a {kind}"
                item.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_DriveNetIcon))
            item.setToolTip(f"{row.title}\n{kind}, last change {_when(row.updated)}")
            if row.mode == "notebook":  # told apart at a glance: an italic title
                font = item.font()
                font.setItalic(True)
                item.setFont(font)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if row.id == current:
                self.list.setCurrentItem(item)
        self._filling = False
        self._update_buttons()

    def _update_buttons(self, *_args) -> None:
        has = self.list.currentItem() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    def _on_current_changed(self, conv) -> None:
        """Select the open conversation in place (reloading if the list does not show it)."""
        for i in range(self.list.count()):
            item = self.list.item(i)
            if conv is not None and int(item.data(ID_ROLE)) == conv.id:
                self._filling = True
                self.list.setCurrentItem(item)
                self._filling = False
                return
        self._reload_timer.start()

    def _on_current_item_changed(self, item: QListWidgetItem | None, _prev) -> None:
        if self._filling or item is None:
            return
        conversation_id = int(item.data(ID_ROLE))
        # Opening writes only the unsaved tokens of the chat it leaves; while another connection holds the write
        # lock it waits for it on the event loop (app/state/write_queue.py), the status bar says so.
        write_queue(self._library.store).run("opening the chat", lambda: self._library.open(conversation_id),
                                             atomic=False)

    def _on_item_renamed(self, item: QListWidgetItem) -> None:
        if not self._filling:
            conversation_id, title = int(item.data(ID_ROLE)), item.text()
            write_queue(self._library.store).run("renaming the chat",
                                                 lambda: self._library.rename(conversation_id, title))

    def begin_rename(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def _on_delete_clicked(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        # Read before asking: the list may be refilled while the question is open (a streaming answer
        # renames its conversation), which deletes this item.
        conversation_id, title = int(item.data(ID_ROLE)), item.text()
        answer = QMessageBox.question(
            self, "Delete conversation", f"Delete “{title}” and all its branches? This cannot be undone."
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(conversation_id)
