"""Model ▸ Library: the models on this machine and the recent ones in a searchable table; Open loads the
selected one; a hub id or a .gguf address downloads with a progress bar (bytes, speed, time left) and Cancel.

Scans and downloads block (disk, network), so each runs on this dialog's own
worker threads through `app.controllers.off_thread.run_off_thread`: the result and the
download's progress come back on the event loop (qasync's rule: worker
threads never touch widgets). Closing the dialog cancels a download
under way; what arrived of a .gguf address is kept and the next download of
it resumes. A .gguf address whose file name is already taken in the models
folder asks first: replace it, keep both, or cancel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import EngineError, library

from app.controllers.off_thread import run_off_thread
from app.state.models.model_library import LibraryRow, ModelLibraryState
from app.state.database.store import Store
from app.widgets.dialogs.file_dialogs import open_folder

log = logging.getLogger(__name__)

COLUMNS = (("Name", "name"), ("Source", "source"), ("Architecture", "architecture"), ("Parameters", "parameters"),
           ("Quantization", "quantization"), ("Size", "size"), ("Context", "context"), ("Memory needed", "memory"),
           ("Runs on", "backend"))
FIT_COLOURS = {"too big": QColor(200, 60, 60), "tight": QColor(200, 140, 0)}
RecentFn = Callable[[], Sequence[dict[str, str]]]
# The engine's advice after a failed hub download names this dialog; said inside it, it points at the list instead.
SELF_REFERENCE = library.HUB_ALTERNATIVE
IN_THIS_DIALOG = "open one of the models listed above"


class LibraryDialog(QDialog):
    """Show it, then `rescan()`; `open_requested(spec, backend)` when the user opens a model."""

    open_requested = Signal(str, str)

    def __init__(self, state: ModelLibraryState, store: Store, recent: RecentFn, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("model_library")
        self.setWindowTitle("Model library")
        self.resize(980, 560)
        self.state, self.store, self._recent = state, store, recent
        self.rows: list[LibraryRow] = []  # what the table shows, in its order
        self.scanning: asyncio.Task | None = None
        self.downloading: asyncio.Task | None = None
        self._cancel: library.CancelToken | None = None  # the download under way's switch
        # Two threads: a scan after a download does not wait behind another download.
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="logitlab-library")

        self.search = QLineEdit(placeholderText="Search by name, source, architecture, quantization or path")
        self.search.setAccessibleName("Search models")
        self.search.textChanged.connect(self._fill)
        add_folder = QPushButton("Add folder…")
        add_folder.setToolTip("Also look for models in a folder of yours (remembered)")
        add_folder.clicked.connect(self._add_folder)
        self.rescan_button = QPushButton("Rescan")
        self.rescan_button.clicked.connect(self.rescan)
        top = QHBoxLayout()
        top.addWidget(self.search, 1)
        top.addWidget(add_folder)
        top.addWidget(self.rescan_button)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setAccessibleName("Models")
        self.table.setHorizontalHeaderLabels([c for c, _ in COLUMNS])
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.itemSelectionChanged.connect(self._update_open)
        self.table.cellDoubleClicked.connect(lambda _r, _c: self.open_selected())
        self.summary = QLabel("Looking for models…")
        self.summary.setWordWrap(True)

        self.source = QLineEdit(placeholderText="org/name, org/name:Q4_K_M, org/name/file.gguf or https://…/file.gguf")
        self.source.setAccessibleName("Model to download")
        self.source.returnPressed.connect(self.start_download)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Download progress")
        self.progress.setVisible(False)
        self.progress_text = QLabel("")
        self.progress_text.setWordWrap(True)
        download = QHBoxLayout()
        download.addWidget(self.source, 1)
        download.addWidget(self.download_button)
        download.addWidget(self.cancel_button)

        self.open_button = QPushButton("Open")
        self.open_button.setDefault(True)
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self.open_selected)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.open_button)
        buttons.addWidget(close)

        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.summary)
        lay.addLayout(download)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_text)
        lay.addLayout(buttons)
        state.changed.connect(self._on_state_changed)
        self.finished.connect(self._on_finished)
        self._fill()

    # -- scanning --------------------------------------------------------------------------------

    def rescan(self, select_spec: str = "") -> asyncio.Task:
        """Scan every location off the UI thread; the table refills when it is done."""
        if self.scanning is not None and not self.scanning.done():
            return self.scanning
        self.rescan_button.setEnabled(False)
        locations = self.state.locations(self._recent())
        pending = run_off_thread(lambda _state: library.scan(locations), executor=self._pool)
        self.scanning = asyncio.ensure_future(self._scanned(pending, select_spec))
        return self.scanning

    async def _scanned(self, pending: Awaitable[Any], select_spec: str) -> None:
        try:
            self.state.set_scan(await pending)
        except Exception as e:  # noqa: BLE001 - a scan bug must not take the dialog down; it is logged
            log.exception("model library scan failed")
            self.summary.setText(f"The scan failed: {e}")
        finally:
            self.rescan_button.setEnabled(True)
        if select_spec:
            self.select(select_spec)

    def _add_folder(self) -> None:
        folder = open_folder(self, self.store, "library", "A folder with models")
        if folder is not None and self.state.add_folder(folder):
            self.rescan()

    # -- the table -------------------------------------------------------------------------------

    def _on_state_changed(self) -> None:
        self._fill()

    def _fill(self) -> None:
        chosen = self.selected_row()
        self.rows = self.state.rows(self._recent(), self.search.text())
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            tip = "\n".join(x for x in (row.path or row.spec, f"Cannot be opened: {row.problem}" if row.problem else "",
                                        "Opened recently" if row.recent else "") if x)
            for c, (_title, field) in enumerate(COLUMNS):
                item = QTableWidgetItem(getattr(row, field))
                item.setToolTip(tip)
                if row.problem:
                    item.setForeground(QColor(140, 140, 140))
                elif field == "memory" and row.fit in FIT_COLOURS:
                    item.setForeground(FIT_COLOURS[row.fit])
                self.table.setItem(r, c, item)
        self.summary.setText(self.state.summary(self._recent(), self.search.text()))
        if chosen is not None:
            self.select(chosen.spec)
        self._update_open()

    def selected_row(self) -> LibraryRow | None:
        picked = self.table.selectionModel().selectedRows()
        return self.rows[picked[0].row()] if picked and picked[0].row() < len(self.rows) else None

    def select(self, spec: str) -> bool:
        for r, row in enumerate(self.rows):
            if row.spec == spec:
                self.table.selectRow(r)
                return True
        return False

    def _update_open(self) -> None:
        row = self.selected_row()
        self.open_button.setEnabled(row is not None and row.openable)

    def open_selected(self) -> None:
        row = self.selected_row()
        if row is None or not row.openable:
            return
        self.open_requested.emit(row.spec, row.backend if row.recent else "auto")
        self.accept()

    # -- downloading -----------------------------------------------------------------------------

    def start_download(self) -> asyncio.Task | None:
        text = self.source.text().strip()
        if not text or (self.downloading is not None and not self.downloading.done()):
            return None
        if_exists = self._if_exists(text)
        if if_exists is None:
            self.progress_text.setText("Nothing was downloaded.")
            return None
        cancel = self._cancel = library.CancelToken()
        self._set_downloading(True)
        self.progress_text.setText(f"Starting the download of {text}…")
        pending = run_off_thread(  # progress: the download thread reports, the dialog shows it on the loop
            lambda state: library.pull(text, progress=state.report, cancel=cancel, if_exists=if_exists),
            on_progress=self._show_progress, executor=self._pool)
        self.downloading = asyncio.ensure_future(self._downloaded(pending, text))
        return self.downloading

    def _if_exists(self, text: str) -> library.IfExists | None:
        """"refuse" when nothing is in the way; else what the user chose ("replace", "keep-both"; None: cancel)."""
        try:
            target = library.url_target(text)
        except EngineError:  # not something to download: the download itself says so, in its words
            return "refuse"
        if target is None or not target.exists():
            return "refuse"
        return self.ask_if_exists(target)

    def ask_if_exists(self, target: Path) -> library.IfExists | None:
        """Ask what to do with a file of the same name already in the models folder (tests replace this)."""
        box = QMessageBox(QMessageBox.Icon.Question, "A file with this name exists",
                          f"{library.printable(target.name)} is already in {library.printable(str(target.parent))} "
                          "(another download with the same file name?).", parent=self)
        box.setInformativeText("Keep both gives the new file a number; Replace deletes the file that is there.")
        keep = box.addButton("Keep both", QMessageBox.ButtonRole.AcceptRole)
        replace = box.addButton("Replace", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(keep)
        box.exec()
        clicked = box.clickedButton()
        return "keep-both" if clicked is keep else "replace" if clicked is replace else None

    async def _downloaded(self, pending: Awaitable[Any], text: str) -> None:
        try:
            result = await pending
        except EngineError as e:
            self._say_failed(str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug is logged and said, the dialog stays
            log.exception("download of %s failed", text)
            self._say_failed(f"{type(e).__name__}: {e}")
            return
        finally:
            self._set_downloading(False)
        self.progress.setValue(self.progress.maximum())
        self.progress_text.setText(f"Downloaded {library.printable(text)} to {library.printable(str(result.path))}. "
                                   "Select it and press Open.")
        await self.rescan(select_spec=result.spec)

    def _say_failed(self, why: str) -> None:
        """A download that ended without a file: the reason in words, no bar (a 0 % bar read as one still
        waiting), and no advice to open the Library from inside it."""
        self.progress.setVisible(False)
        why = why.replace(SELF_REFERENCE, IN_THIS_DIALOG)
        self.progress_text.setText(f"Not downloaded: {why[:1].lower()}{why[1:]}")

    def cancel_download(self) -> None:
        if self._cancel is not None:
            self._cancel.cancel()
            self.progress_text.setText("Cancelling…")

    def _show_progress(self, p: library.DownloadProgress) -> None:
        if p.fraction is None:
            self.progress.setRange(0, 0)  # busy: the size is not known yet
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(p.fraction * 1000))
        self.progress_text.setText(f"{p.what}: {p.describe()}")

    def _set_downloading(self, busy: bool) -> None:
        self.download_button.setEnabled(not busy)
        self.source.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)
        if busy:
            self.progress.setRange(0, 1000)
            self.progress.setValue(0)
            self.progress.setVisible(True)

    def _on_finished(self, _result: int) -> None:
        self.cancel_download()
        for task in (self.scanning, self.downloading):  # their results would land on deleted widgets
            if task is not None and not task.done():
                task.cancel()
        self.state.changed.disconnect(self._on_state_changed)
        self._pool.shutdown(wait=False)
