"""The list of conversations: search, new, rename, delete, folders and tags; the open one is selected.

The folder rows above the list filter it (with the tag filter and the search, together) and take chats
dragged onto them; a chat's context menu (right click, or the Menu key for a keyboard) moves it to a
folder and tags it (app/widgets/chat/folder_pane.py, app/state/folders.py)."""

from __future__ import annotations

import time

from collections.abc import Callable

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.state.conversation import Conversation
from app.state.conversation_list import Library
from app.state.folders import ALL, NONE, FolderChoice
from app.state.database.write_queue import write_queue
from app.widgets.chat.folder_pane import ID_ROLE, ChatList, FolderPane


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
        self.folder_pane = FolderPane()
        self.list = ChatList()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
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
        lay.addWidget(self.folder_pane)
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
        self._wire_folders()

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
        folder, tag, where, tags = self._fill_folders()
        for row in self._library.summaries(self.search.text(), folder, tag):
            item = QListWidgetItem(row.title)
            item.setData(ID_ROLE, row.id)
            kind = "notebook (text the model continues)" if row.mode == "notebook" else "chat"
            if row.served:  # a client's request to Model ▸ Serve…: marked with a network icon
                kind = f"served to {row.served.get('client') or 'a client'} (Model ▸ Serve…), as a {kind}"
                item.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_DriveNetIcon))
            marks = " ".join(f"#{t}" for t in tags.get(row.id, []))
            item.setToolTip(f"{row.title}\n{kind}, last change {_when(row.updated)}"
                            + (f"\nin the folder {where[row.id]}" if row.id in where else "")
                            + (f"\n{marks}" if marks else ""))
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

    def _update_buttons(self, *_args: object) -> None:
        has = self.list.currentItem() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    def _on_current_changed(self, conv: Conversation | None) -> None:
        """Select the open conversation in place (reloading if the list does not show it)."""
        for i in range(self.list.count()):
            item = self.list.item(i)
            if conv is not None and int(item.data(ID_ROLE)) == conv.id:
                self._filling = True
                self.list.setCurrentItem(item)
                self._filling = False
                return
        self._reload_timer.start()

    def _on_current_item_changed(self, item: QListWidgetItem | None, _prev: QListWidgetItem | None) -> None:
        if self._filling or item is None:
            return
        conversation_id = int(item.data(ID_ROLE))
        # Opening writes only the unsaved tokens of the chat it leaves; while another connection holds the write
        # lock it waits for it on the event loop (app/state/database/write_queue.py), the status bar says so.
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

    # -- folders and tags ------------------------------------------------------------------------------------

    def _wire_folders(self) -> None:
        pane = self.folder_pane
        pane.folders.currentItemChanged.connect(lambda *_: self._schedule_reload())
        pane.folders.itemChanged.connect(self._on_folder_renamed)
        pane.folders.chats_dropped.connect(self._on_chats_dropped)
        pane.folders.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        pane.folders.customContextMenuRequested.connect(self._on_folder_menu)
        pane.tags.currentIndexChanged.connect(lambda *_: self._schedule_reload())
        pane.new_button.clicked.connect(self.new_folder)
        self.list.customContextMenuRequested.connect(self._on_chat_menu)

    def _fill_folders(self) -> tuple[FolderChoice, str | None, dict[int, str], dict[int, list[str]]]:
        """Refill the folder rows and the tag filter, keeping the choices; returns the choices, each filed chat's
        folder name and each chat's tags."""
        folders = self._library.folders.all()
        assigned = self._library.folders.assignments(folders)
        tags = self._library.folders.tag_map()
        every_tag = sorted({t for ts in tags.values() for t in ts}, key=str.casefold)
        folder = self.folder_pane.folders.choice()
        if isinstance(folder, int) and folder not in {f.id for f in folders}:
            folder = ALL  # the folder shown was deleted
        tag = self.folder_pane.tag()
        tag = tag if tag in every_tag else None
        counts: dict[FolderChoice, int] = {}
        for folder_id in assigned.values():
            counts[folder_id] = counts.get(folder_id, 0) + 1
        self.folder_pane.fill(folders, counts, folder, every_tag, tag)
        names = {f.id: f.name for f in folders}
        return folder, tag, {c: names[f] for c, f in assigned.items()}, tags

    def _folder_write(self, what: str, action: Callable[[], object]) -> None:
        """Run a folder or tag write; what it cannot do (a name left empty, a folder gone) said under the folders."""
        self.folder_pane.say("")
        try:
            write_queue(self._library.store).run(what, action)
        except ValueError as e:
            self.folder_pane.say(f"{what[0].upper()}{what[1:]}: {e}.")
            self._schedule_reload()

    def new_folder(self) -> None:
        """A folder called "New folder" (or "New folder 2"…), shown and its name opened for typing."""
        made: list[int] = []
        self._folder_write("making a folder", lambda: made.append(self._library.create_folder("New folder")))
        if made:
            self._reload()
            item = self.folder_pane.folders.item_of(made[0])
            if item is not None:
                self.folder_pane.folders.setCurrentItem(item)
                self.folder_pane.folders.editItem(item)

    def _on_folder_renamed(self, item: QListWidgetItem) -> None:
        folder_id = item.data(ID_ROLE)
        if isinstance(folder_id, int):
            name = item.text()
            self._folder_write("renaming the folder", lambda: self._library.rename_folder(folder_id, name))

    def delete_folder(self, folder_id: int, name: str) -> None:
        answer = QMessageBox.question(
            self, "Delete folder", f"Delete the folder “{name}”? Its chats are kept, in no folder.")
        if answer == QMessageBox.StandardButton.Yes:
            self._folder_write("deleting the folder", lambda: self._library.delete_folder(folder_id))

    def _on_folder_menu(self, pos: QPoint) -> None:
        item = self.folder_pane.folders.itemAt(pos) or self.folder_pane.folders.currentItem()
        menu = QMenu(self)
        menu.addAction("New folder", self.new_folder)
        folder_id = None if item is None else item.data(ID_ROLE)
        if item is not None and isinstance(folder_id, int):
            menu.addAction("Rename folder", lambda: self.folder_pane.folders.editItem(item))
            name = item.text()
            menu.addAction("Delete folder…", lambda: self.delete_folder(folder_id, name))
        menu.exec(self.folder_pane.folders.viewport().mapToGlobal(pos))
        menu.deleteLater()  # one menu per opening: not kept with the sidebar

    def _on_chats_dropped(self, ids: list[int], folder_id: int | None) -> None:
        for conversation_id in ids:
            self.move_chat(conversation_id, folder_id)

    def move_chat(self, conversation_id: int, folder_id: int | None) -> None:
        self._folder_write("moving the chat", lambda: self._library.move_to_folder(conversation_id, folder_id))

    def chat_menu(self, conversation_id: int) -> QMenu:
        """A chat's context menu: Move to folder ▸, Tags ▸, Rename, Delete (built, not shown)."""
        menu = QMenu(self)
        move = menu.addMenu("Move to folder")
        folders = self._library.folders.all()
        here = self._library.folders.assignments(folders).get(conversation_id)
        for name, folder_id in [("No folder", None), *((f.name, f.id) for f in folders)]:
            action = move.addAction(name, self._mover(conversation_id, folder_id))
            action.setCheckable(True)
            action.setChecked(folder_id == here)
        move.addSeparator()
        move.addAction("New folder…", lambda: self._move_to_new_folder(conversation_id))
        tags_menu = menu.addMenu("Tags")
        mine = set(self._library.folders.tags_of(conversation_id))
        for tag in self._library.folders.all_tags():
            action = tags_menu.addAction(f"#{tag}", self._tagger(conversation_id, tag, tag not in mine))
            action.setCheckable(True)
            action.setChecked(tag in mine)
        tags_menu.addSeparator()
        tags_menu.addAction("Add tag…", lambda: self._add_tag(conversation_id))
        menu.addSeparator()
        menu.addAction("Rename", self.begin_rename)
        menu.addAction("Delete…", self._on_delete_clicked)
        return menu

    def _mover(self, conversation_id: int, folder_id: int | None) -> Callable[[], None]:
        return lambda: self.move_chat(conversation_id, folder_id)

    def _tagger(self, conversation_id: int, tag: str, on: bool) -> Callable[[], None]:
        return lambda: self._set_tag(conversation_id, tag, on)

    def _on_chat_menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos) or self.list.currentItem()  # the Menu key: the selected chat
        if item is not None:
            self.list.setCurrentItem(item)
            menu = self.chat_menu(int(item.data(ID_ROLE)))
            menu.exec(self.list.viewport().mapToGlobal(pos))
            menu.deleteLater()  # one menu per opening: not kept with the sidebar

    def _ask(self, title: str, label: str) -> str | None:
        text, ok = QInputDialog.getText(self, title, label)
        return text if ok else None

    def _move_to_new_folder(self, conversation_id: int) -> None:
        name = self._ask("New folder", "The new folder's name:")
        if name is not None:
            self._folder_write("making a folder", lambda: self._library.move_to_folder(
                conversation_id, self._library.create_folder(name)))

    def _set_tag(self, conversation_id: int, tag: str, on: bool) -> None:
        self._folder_write("tagging the chat", lambda: self._library.set_tag(conversation_id, tag, on))

    def _add_tag(self, conversation_id: int) -> None:
        tag = self._ask("Add tag", "Tag this chat with:")
        if tag is not None:
            self._set_tag(conversation_id, tag.strip().lstrip("#"), True)
