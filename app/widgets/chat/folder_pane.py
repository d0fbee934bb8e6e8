"""The sidebar's folders and tag filter, and its chat list as a drag source (app/widgets/chat/sidebar.py wires them).

A chat is dragged from the chat list onto a folder row (or onto "No folder"); the list's own drag data
carries the chats' ids in a format of ours, so the drop needs nothing but the event. The folder rows are
the filter as well: clicking one lists its chats only, "All chats" lists every one.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.state.folders import ALL, NONE, Folder, FolderChoice

ID_ROLE = Qt.ItemDataRole.UserRole
CHAT_IDS_MIME = "application/x-logitlab-conversation-ids"
SHOWN_ROWS = 5  # folder rows shown before the list scrolls: the chats below keep the room


def chat_ids(mime: QMimeData) -> list[int]:
    """The conversation ids a drag from the chat list carries ([] for anything else dropped here)."""
    if not mime.hasFormat(CHAT_IDS_MIME):
        return []
    raw = bytes(mime.data(CHAT_IDS_MIME).data()).decode("ascii", "replace")
    return [int(part) for part in raw.split(",") if part.strip().isdigit()]


class ChatList(QListWidget):
    """The conversations; a drag of one carries its id (`CHAT_IDS_MIME`) to the folder list."""

    def __init__(self) -> None:
        super().__init__()
        self.setDragEnabled(True)
        self.setDragDropMode(QAbstractItemView.DragDropMode.DragOnly)

    def mimeTypes(self) -> list[str]:
        return [*super().mimeTypes(), CHAT_IDS_MIME]

    def mimeData(self, items: Sequence[QListWidgetItem]) -> QMimeData:
        mime = super().mimeData(list(items))
        mime.setData(CHAT_IDS_MIME, ",".join(str(int(i.data(ID_ROLE))) for i in items).encode("ascii"))
        return mime


class FolderList(QListWidget):
    """"All chats", "No folder" and the folders; chats dropped on a folder row move into it."""

    chats_dropped = Signal(list, object)  # (conversation ids, folder id | None for "No folder")

    def __init__(self) -> None:
        super().__init__()
        self.setAccessibleName("Folders")
        self.setAcceptDrops(True)
        self.setDragDropMode(QAbstractItemView.DragDropMode.DropOnly)
        self.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)

    def _target(self, event: QDropEvent | QDragMoveEvent) -> FolderChoice | None:
        """The folder a drop at the event's place lands in (NONE for "No folder"); None where nothing takes it."""
        item = self.itemAt(event.position().toPoint())
        if item is None or not chat_ids(event.mimeData()):
            return None
        choice: FolderChoice = item.data(ID_ROLE)
        return None if choice == ALL else choice

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if chat_ids(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        if self._target(event) is not None:
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        target = self._target(event)
        if target is None:
            event.ignore()
            return
        event.acceptProposedAction()
        self.chats_dropped.emit(chat_ids(event.mimeData()), None if target == NONE else target)

    def fill(self, folders: list[Folder], counts: dict[FolderChoice, int], chosen: FolderChoice) -> None:
        """Rows for every choice; `chosen` selected (All chats where it is gone). Not while a name is being typed
        (a chat streaming in refills the sidebar): the editor would go with its row."""
        if self.state() == QAbstractItemView.State.EditingState:
            return
        self.blockSignals(True)
        self.clear()
        rows: list[tuple[str, FolderChoice]] = [("All chats", ALL), ("No folder", NONE)]
        rows += [(f.name, f.id) for f in folders]
        for name, choice in rows:
            item = QListWidgetItem(name)
            item.setData(ID_ROLE, choice)
            n = counts.get(choice, 0)
            item.setToolTip(f"{name}: {n} chat{'' if n == 1 else 's'}" + (
                "\nDrop a chat here to move it; F2 or a double click renames" if isinstance(choice, int) else ""))
            if isinstance(choice, int):
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.addItem(item)
            if choice == chosen:
                self.setCurrentItem(item)
        if self.currentItem() is None:
            self.setCurrentRow(0)
        row_height = max(self.sizeHintForRow(0), 1)
        self.setFixedHeight(row_height * min(self.count(), SHOWN_ROWS) + 2 * self.frameWidth() + 2)
        self.blockSignals(False)

    def choice(self) -> FolderChoice:
        item = self.currentItem()
        return ALL if item is None else item.data(ID_ROLE)

    def item_of(self, choice: FolderChoice) -> QListWidgetItem | None:
        return next((self.item(i) for i in range(self.count()) if self.item(i).data(ID_ROLE) == choice), None)


class FolderPane(QWidget):
    """The "Folders" head (with New folder), the folder list and the tag filter; hidden parts while unused."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.new_button = QToolButton()
        self.new_button.setText("+")
        self.new_button.setAccessibleName("New folder")
        self.new_button.setToolTip("New folder (drag chats onto it, or right-click a chat ▸ Move to folder)")
        self.folders = FolderList()
        self.tags = QComboBox()
        self.tags.setAccessibleName("Filter by tag")
        # As wide as the panel, never wider: a long tag must not widen the sidebar (and the window's least width).
        self.tags.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.tags.setMinimumContentsLength(8)
        self.tags.setToolTip("List only the chats with this tag (right-click a chat ▸ Tags to tag it)")
        self.note = QLabel()  # what a folder or tag action could not do, in words
        self.note.setWordWrap(True)
        self.note.hide()
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(QLabel("Folders"), 1)
        head.addWidget(self.new_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        lay.addLayout(head)
        lay.addWidget(self.folders)
        lay.addWidget(self.tags)
        lay.addWidget(self.note)

    def say(self, text: str) -> None:
        """Show `text` under the folders ("" hides the line)."""
        self.note.setText(text)
        self.note.setVisible(bool(text))

    def fill(self, folders: list[Folder], counts: dict[FolderChoice, int], chosen: FolderChoice,
             tags: list[str], chosen_tag: str | None) -> None:
        self.folders.fill(folders, counts, chosen)
        self.folders.setVisible(bool(folders) or chosen != ALL)
        self.tags.blockSignals(True)
        self.tags.clear()
        self.tags.addItem("All tags", None)
        for tag in tags:
            self.tags.addItem(f"#{tag}", tag)
        at = self.tags.findData(chosen_tag) if chosen_tag is not None else 0
        self.tags.setCurrentIndex(max(at, 0))
        self.tags.setVisible(bool(tags))
        self.tags.blockSignals(False)

    def tag(self) -> str | None:
        value = self.tags.currentData()
        return value if isinstance(value, str) else None
