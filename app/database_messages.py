"""What the window says about its database: the start-up notice, failed and resumed saves, a held lock, damage.

Apart from the main window because it is one job with its own signals: the store's (`busy_changed`,
`damaged`) and the chat controller's (`save_failed`, `saved`). `detach` disconnects the store's, which
outlives the window (tests open a second window on one store).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QStatusBar, QWidget

from app.state.database.recovery import DatabaseNotice
from app.state.database.store import BUSY_TEXT, Store
from app.widgets.banner import Banner


class DatabaseMessages:
    """The banner lines, status messages and the one start-up dialog about the database."""

    def __init__(self, parent: QWidget, banner: Banner, status: QStatusBar, store: Store,
                 retry_saving: Callable[[], object]) -> None:
        self._parent, self._banner, self._status, self._store = parent, banner, status, store
        self._retry_saving = retry_saving
        self.notice_box: QMessageBox | None = None  # the start-up notice about the database file
        store.busy_changed.connect(self.busy)
        store.damaged.connect(self.damage_read)

    def detach(self) -> None:
        self._store.damaged.disconnect(self.damage_read)
        self._store.busy_changed.disconnect(self.busy)

    def show_notice(self, notice: DatabaseNotice, quit_window: Callable[[], object]) -> QMessageBox:
        """The one dialog about the database at start-up: what was recovered, or what is wrong and what now.

        Opened, not exec()'d: the window stays live (and a test closes it with `done`).
        """
        icon = QMessageBox.Icon.Warning if notice.temporary else QMessageBox.Icon.Information
        box = QMessageBox(icon, notice.title, notice.text, parent=self._parent)
        box.setObjectName("database_notice")
        box.setAccessibleName(notice.title)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # paths can be copied
        if notice.temporary:
            go_on = box.addButton("Continue without saving", QMessageBox.ButtonRole.AcceptRole)
            quit_button = box.addButton("Quit", QMessageBox.ButtonRole.RejectRole)
            go_on.setObjectName("continue_temporary")
            quit_button.setObjectName("quit")
            quit_button.clicked.connect(quit_window)
            box.setDefaultButton(go_on)
            self._banner.show_message("database", f"{notice.title}: running on a temporary database — nothing is saved.")
        else:
            box.addButton(QMessageBox.StandardButton.Ok)
        box.open()
        self.notice_box = box
        return box

    def save_failed(self, reason: str) -> None:
        self._banner.show_message(
            "saving",
            f"Saving failed: {reason}. Your conversation is kept in this window; Logit Lab tries again "
            "every few seconds, when you export and when you quit.",
            "Try again",
            self._retry_saving,
        )

    def saved(self) -> None:
        self._banner.clear("saving")
        self._status.showMessage("Everything is saved again.", 6000)

    def busy(self, busy: bool) -> None:
        # Another connection holds the write lock: writes wait in memory (app/state/database/store.py); say so until free.
        if busy:
            self._status.showMessage(BUSY_TEXT[:1].upper() + BUSY_TEXT[1:])
        elif self._status.currentMessage().lower() == BUSY_TEXT.lower():
            self._status.clearMessage()

    def damage_read(self, what: str) -> None:
        self._banner.show_message(
            "damage",
            f"The database is damaged: {what}. What could be read is shown. Logit Lab will repair the file when "
            "it next starts (the damaged file is kept).",
        )
