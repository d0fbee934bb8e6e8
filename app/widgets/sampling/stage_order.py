"""The sampler chain's stage order: drag (or Move up/down) to reorder, untick to leave a stage out."""

from __future__ import annotations

from engine import STAGE_NAMES, STAGE_ROWS
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QHBoxLayout, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

STAGE_HELP = {name: row.help for name, row in STAGE_ROWS.items()}  # one line per stage, the registry's


class StageOrderList(QWidget):
    """Emits `order_changed(tuple)` with the ticked stages in list order."""

    order_changed = Signal(tuple)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setAccessibleName("Sampler stage order")
        self.list.setDragDropMode(QAbstractItemView.DragDropMode.InternalMove)
        self.list.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        rows = self.list.sizeHintForRow(0) if self.list.count() else self.fontMetrics().lineSpacing() + 6
        self.list.setFixedHeight(rows * len(STAGE_NAMES) + 8)
        self.up = QPushButton("Move up")
        self.down = QPushButton("Move down")
        self.up.setAccessibleName("Move stage up")
        self.down.setAccessibleName("Move stage down")
        self.up.clicked.connect(lambda: self._move(-1))
        self.down.clicked.connect(lambda: self._move(+1))
        buttons = QHBoxLayout()
        buttons.addWidget(self.up)
        buttons.addWidget(self.down)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(self.list)
        col.addLayout(buttons)
        self.list.model().rowsMoved.connect(self._emit)
        self.list.itemChanged.connect(self._emit)
        self._building = False

    def set_order(self, order: tuple[str, ...]) -> None:
        """Show `order` ticked, in order, followed by the stages it leaves out (unticked)."""
        self._building = True
        self.list.clear()
        for name in list(order) + [n for n in STAGE_NAMES if n not in order]:
            item = QListWidgetItem(name.replace("_", "-"))
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setToolTip(STAGE_HELP.get(name, ""))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsDragEnabled)
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsDropEnabled)
            item.setCheckState(Qt.CheckState.Checked if name in order else Qt.CheckState.Unchecked)
            self.list.addItem(item)
        # Exactly as tall as its rows (known only once there are items): no blank band, no inner scrolling.
        self.list.setFixedHeight(self.list.sizeHintForRow(0) * self.list.count() + 2 * self.list.frameWidth() + 4)
        self._building = False

    def order(self) -> tuple[str, ...]:
        items = (self.list.item(i) for i in range(self.list.count()))
        return tuple(
            it.data(Qt.ItemDataRole.UserRole) for it in items if it.checkState() == Qt.CheckState.Checked
        )

    def _move(self, offset: int) -> None:
        row = self.list.currentRow()
        target = row + offset
        if row < 0 or not 0 <= target < self.list.count():
            return
        self._building = True
        item = self.list.takeItem(row)
        self.list.insertItem(target, item)
        self.list.setCurrentRow(target)
        self._building = False
        self._emit()

    def _emit(self, *_args: object) -> None:
        if not self._building:
            self.order_changed.emit(self.order())
