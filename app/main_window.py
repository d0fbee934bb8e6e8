"""The main window: builds the state, the views and the menus, and turns user actions into async work.

Async slots (`@asyncSlot`) run on the qasync loop; each disables what it
must and re-enables it in `finally`. Closing while an answer streams stops
it, waits for the last tokens, writes them, then really closes.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QDockWidget, QFileDialog, QMainWindow, QMessageBox, QVBoxLayout, QWidget
from qasync import asyncSlot, asyncWrap

from engine import DefaultModelMissingError, EngineError, RemoteCodeRefusedError, download_default_model

from app.controller import Busy, ChatController
from app.engine_host import EngineHost
from app.menus import build_menus
from app.state.conversation import Message
from app.state.export import to_json, to_markdown
from app.state.library import Library
from app.state.recovery import DatabaseNotice
from app.state.servers import ApiKeys, prepare_connection, remember_server
from app.state.settings import Selection, SettingsState, ViewOptions
from app.state.store import Store
from app.theme import Theme, app_icon
from app.widgets.banner import Banner
from app.widgets.chat_pane import ChatPane
from app.widgets.connect_dialog import ConnectChoice, ConnectDialog
from app.widgets.inspector import Inspector
from app.widgets.model_picker import ModelPicker, recent_models, remember_model, remote_code_confirmation
from app.widgets.sampling_panel import SamplingPanel
from app.widgets.sidebar import Sidebar
from app.widgets.status_bar import StatusBar

log = logging.getLogger(__name__)

GEOMETRY_KEY = "window_geometry"
DEFAULT_SIZE = (1400, 880)  # the first start's window, where the screen has room for it
DEFAULT_DOCK_WIDTHS = (300, 470)  # chats, inspector: their widths in a window of the default size
APPEARANCE_KEY = "appearance"
NOTHING_SAVED = "nothing saved"  # in the title bar while the app runs on a temporary database


class MainWindow(QMainWindow):
    closed = Signal()  # after the last tokens are written

    def __init__(self, store: Store, host: EngineHost, theme: Theme | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Logit Lab")
        self.setWindowIcon(app_icon())
        self.store = store
        self.host = host
        self.theme = theme
        self.library = Library(store)
        self.settings = SettingsState(store)
        self.api_keys = ApiKeys()  # server keys: the OS keyring when installed, else this session only
        self.view_options = ViewOptions(store)
        self.selection = Selection()
        self.controller = ChatController(self.library, self.settings, host)
        self.error_box: QMessageBox | None = None
        self.database_box: QMessageBox | None = None  # the start-up notice about the database file
        self._model_title = ""
        self._closing = False
        self._shutdown_done = False
        self._tasks: set[asyncio.Future] = set()

        self.chat = ChatPane(self.library, self.view_options, self.selection, self.controller)
        self.banner = Banner()
        central = QWidget()
        column = QVBoxLayout(central)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.banner)
        column.addWidget(self.chat, 1)
        self.setCentralWidget(central)
        self.sidebar = Sidebar(self.library)
        self.sampling = SamplingPanel(self.settings, self.controller)
        self.inspector = Inspector(self.library, self.selection, self.controller)
        self.chats_dock = self._dock("Chats", self.sidebar, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.sampling_dock = self._dock("Sampling", self.sampling, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.tabifyDockWidget(self.chats_dock, self.sampling_dock)
        self.chats_dock.raise_()
        self.inspector_dock = self._dock("Inspector", self.inspector, Qt.DockWidgetArea.RightDockWidgetArea)
        self.status = StatusBar(host, self.controller)
        self.setStatusBar(self.status)
        self.actions_ = build_menus(self)

        composer = self.chat.composer
        composer.send_requested.connect(self.on_send)
        composer.stop_requested.connect(self.controller.stop)
        view = self.chat.chat_view
        view.regenerate_requested.connect(self.on_regenerate)
        view.continue_requested.connect(self.on_continue)
        view.edit_submitted.connect(self.on_edit_submitted)
        self.inspector.branch_requested.connect(self.on_branch)
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.selection.changed.connect(self._on_selection_changed)
        self.controller.error.connect(lambda text: self.status.showMessage(f"Generation failed: {text}", 15000))
        self.controller.busy_changed.connect(self._on_busy_changed)
        self.controller.save_failed.connect(self._on_save_failed)
        self.controller.saved.connect(self._on_saved)
        store.damaged.connect(self._on_damage_read)
        self.controller.started.connect(self._on_generation_started)
        # The host can outlive this window (tests open a second one on it): closing disconnects these.
        host.load_failed.connect(self._on_load_failed)
        host.state_changed.connect(self._on_load_state)

        self.library.open_last()
        self._restore_geometry()
        self._on_busy_changed(False)
        self._update_title()

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"{title.lower()}_dock")
        dock.setWidget(widget)
        dock.setAccessibleName(title)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(area, dock)
        return dock

    # -- model -----------------------------------------------------------------------------

    def start(self, spec: str | None = None, backend: str | None = None) -> asyncio.Task:
        """Load the model given on the command line, else the last one used, else the default."""
        if spec is None and backend is None:
            recent = recent_models(self.store)
            if recent:
                spec = None if recent[0]["spec"] == "default" else recent[0]["spec"]
                backend = recent[0].get("backend", "auto")
        return self.load_model(spec, backend or "auto")

    def load_model(self, spec: str | None, backend: str = "auto", trust_remote_code: bool = False) -> asyncio.Task:
        """Start loading (the host counts as loading at once); the task gives True on success.

        `trust_remote_code` only after the user confirmed the model's code files by name.
        """
        if backend == "remote" and spec:
            prepare_connection(self.store, self.api_keys, spec)  # its key and timeout, never in the store
        action = self.actions_["open_model"]
        action.setEnabled(False)
        self._requested_backend = backend
        try:
            loading = self.host.load(spec, backend, trust_remote_code=trust_remote_code)
        except RuntimeError as e:  # one load at a time
            action.setEnabled(not self.host.loading)
            self.status.showMessage(str(e), 6000)
            raise
        return self._spawn(self._finish_load(loading, spec, backend))

    async def _finish_load(self, loading: asyncio.Task, spec: str | None, backend: str) -> bool:
        try:
            ok = await loading
            if ok:
                remember_model(self.store, spec, backend)
                self._model_title = self.host.info.name
                self._update_title()
            return ok
        finally:
            self.actions_["open_model"].setEnabled(not self.host.loading)

    @asyncSlot()
    async def open_model_dialog(self) -> None:
        dialog = ModelPicker(self.store, self.host.spec, self.host.backend, self)
        # asyncWrap runs the modal dialog's nested event loop outside this task (qasync's advice).
        if await asyncWrap(dialog.exec) == ModelPicker.DialogCode.Accepted and not self.host.loading:
            await self.load_model(dialog.spec, dialog.backend, trust_remote_code=dialog.trust_remote_code)

    @asyncSlot()
    async def open_connect_dialog(self) -> None:
        dialog = ConnectDialog(self.store, self.api_keys, self.settings.options.server_sampling, self)
        if await asyncWrap(dialog.exec) == ConnectDialog.DialogCode.Accepted and not self.host.loading:
            await self.connect_server(dialog.choice())

    def connect_server(self, choice: ConnectChoice) -> asyncio.Task:
        """Keep the key (keyring or session) and the server (recent list, without the key); load its model."""
        self.api_keys.set(choice.url, choice.api_key, remember=choice.remember_key)
        remember_server(self.store, choice.url, choice.model, choice.timeout_s)
        self.settings.set_server_sampling(choice.server_sampling)
        return self.load_model(choice.spec, "remote")

    def _on_load_state(self, state) -> None:
        self.actions_["open_model"].setEnabled(not state.loading)
        self.actions_["connect_server"].setEnabled(not state.loading)

    def _on_load_failed(self, spec: str | None, message: str) -> None:
        if spec is None and self.host.info is None and isinstance(self.host.last_error, DefaultModelMissingError):
            self._offer_default_model(message)
            return
        if isinstance(self.host.last_error, RemoteCodeRefusedError):
            self._confirm_remote_code(spec, self.host.last_error.files)
            return
        if self.host.info is not None:
            keep = f"The previous model, {self.host.info.name}, is still loaded and in use."
        else:
            keep = "No model is loaded: open one from Model ▸ Open model…"
        box = QMessageBox(QMessageBox.Icon.Warning, "Could not load the model", f"{message}\n\n{keep}", parent=self)
        box.setObjectName("load_error")
        box.setAccessibleName("Model load error")
        box.open()  # not exec(): the window stays responsive and tests are not blocked
        self.error_box = box

    def _confirm_remote_code(self, spec: str | None, files: tuple[str, ...]) -> None:
        """The model needs its own code (a hub id, or a folder opened without the picker): name the files, ask."""
        backend = getattr(self, "_requested_backend", "auto")  # the failed load's, not the current model's
        box = remote_code_confirmation(self, spec or "the model", files)
        box.allow_button.clicked.connect(lambda: self.load_model(spec, backend, trust_remote_code=True))
        box.open()
        self.error_box = box

    def _offer_default_model(self, message: str) -> None:
        """The default model is nowhere (a packaged app's first start): download it, or choose another."""
        box = QMessageBox(QMessageBox.Icon.Information, "Get the default model", message, parent=self)
        box.setObjectName("load_error")
        box.setAccessibleName("Default model missing")
        download = box.addButton("Download (98 MB)", QMessageBox.ButtonRole.AcceptRole)
        choose = box.addButton("Choose a model…", QMessageBox.ButtonRole.ActionRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        download.setObjectName("download_default")
        choose.setObjectName("choose_model")
        download.clicked.connect(lambda: self.download_default_model())
        choose.clicked.connect(lambda: self.open_model_dialog())
        box.open()
        self.error_box = box

    @asyncSlot()
    async def download_default_model(self) -> bool:
        """Download the default model into the user models folder, then load it; False if that failed."""
        loop = asyncio.get_running_loop()

        def progress(message: str, fraction: float | None) -> None:  # download thread
            text = message if fraction is None else f"{message}: {fraction:.0%}"
            loop.call_soon_threadsafe(self.status.showMessage, text)

        self.actions_["open_model"].setEnabled(False)
        self.status.showMessage("Downloading the default model…")
        try:
            # A plain thread, not the loop's default executor (qasync's QThreads outlive a closed window).
            with ThreadPoolExecutor(1, thread_name_prefix="logitlab-download") as pool:
                await asyncio.wrap_future(pool.submit(download_default_model, progress))
        except EngineError as e:
            self.status.clearMessage()
            box = QMessageBox(
                QMessageBox.Icon.Warning,
                "Could not download the default model",
                f"{e}\n\nYou can open a model file or folder instead: Model ▸ Open model…",
                parent=self,
            )
            box.setObjectName("load_error")
            box.open()
            self.error_box = box
            return False
        finally:
            self.actions_["open_model"].setEnabled(not self.host.loading)
        return await self.load_model(None, "auto")

    # -- chat actions ----------------------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            e = task.exception()
            if isinstance(e, sqlite3.Error):  # a write outside a generation (a new message, a rename)
                self._on_save_failed(f"{e}")
            elif isinstance(e, (Busy, ValueError)):
                self.status.showMessage(str(e), 8000)
            else:
                log.error("action failed", exc_info=e)
                self.status.showMessage(f"Something went wrong: {e}", 15000)

    def on_send(self, text: str) -> asyncio.Task:
        self.chat.chat_view.scroll_to_bottom()
        return self._spawn(self.controller.send(text))

    def on_regenerate(self, message: Message | None = None) -> asyncio.Task:
        return self._spawn(self.controller.regenerate(message))

    def on_continue(self, message: Message | None = None) -> asyncio.Task | None:
        if message is None:
            path = self.library.current.path() if self.library.current else []
            message = next((m for m in reversed(path) if m.can_continue), None)
            if message is None:
                return None
        return self._spawn(self.controller.continue_answer(message))

    def on_edit_submitted(self, message: Message, text: str) -> asyncio.Task:
        return self._spawn(self.controller.edit_and_resend(message, text))

    def on_branch(self, message: Message, index: int, token_id: int) -> asyncio.Task:
        return self._spawn(self.controller.branch(message, index, token_id))

    def _on_generation_started(self, message: Message) -> None:
        if message.branch_index is not None and not message.tokens[message.branch_index:]:
            # A new branch: select its forced token, so the inspector follows the branch.
            self.selection.set(message.id, message.branch_index)

    def stop(self) -> None:
        self.controller.stop()

    def new_chat(self) -> None:
        self.library.new()
        self.chat.composer.edit.setFocus()

    def delete_conversation(self, conversation_id: int) -> None:
        generating = self.controller.generating_message
        if generating is not None and self.library.current and self.library.current.id == conversation_id:
            self.controller.stop()
        self.library.delete(conversation_id)

    def toggle_heatmap(self) -> None:
        self.view_options.set_heatmap(not self.view_options.heatmap)

    def export(self, kind: str, path: str | Path | None = None) -> Path | None:
        conv = self.library.current
        if conv is None:
            return None
        suffix = ".md" if kind == "markdown" else ".json"
        if path is None:
            name = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip() or "conversation"
            chosen, _ = QFileDialog.getSaveFileName(self, "Export conversation", name + suffix)
            if not chosen:
                return None
            path = chosen
        self.controller.retry_saving()  # export is a moment to try again what could not be saved
        out = Path(path)
        out.write_text(to_markdown(conv) if kind == "markdown" else to_json(conv), encoding="utf-8")
        self.status.showMessage(f"Exported to {out}", 6000)
        return out

    def set_appearance(self, scheme: str) -> None:
        if self.theme is not None:
            self.theme.set_scheme(scheme)
            self.store.put_setting(APPEARANCE_KEY, scheme)

    # -- reactions -------------------------------------------------------------------------

    def _on_selection_changed(self, message_id: int | None, _index: int | None) -> None:
        if message_id is not None and not self.inspector_dock.isVisible():
            self.inspector_dock.show()

    def _on_busy_changed(self, busy: bool) -> None:
        a = self.actions_
        a["stop"].setEnabled(busy)
        for key in ("regenerate", "continue"):
            a[key].setEnabled(not busy)

    # -- closing ---------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._shutdown_done:
            self._save_geometry()
            self.host.load_failed.disconnect(self._on_load_failed)
            self.host.state_changed.disconnect(self._on_load_state)
            self.store.damaged.disconnect(self._on_damage_read)
            self.status.detach()
            event.accept()
            self.closed.emit()
            return
        event.ignore()
        if not self._closing:
            self._closing = True
            self._save_geometry()
            self.hide()
            asyncio.ensure_future(self._shutdown())

    async def _shutdown(self) -> None:
        try:
            await self.controller.shutdown()
        except Exception:  # noqa: BLE001 - closing must finish
            log.exception("stopping the generation failed while closing")
        finally:
            self._shutdown_done = True
            self.close()

    def _save_geometry(self) -> None:
        try:
            self.store.put_setting(
                GEOMETRY_KEY,
                {"geometry": self.saveGeometry().toBase64().data().decode(), "state": self.saveState().toBase64().data().decode()},
            )
        except sqlite3.Error as e:  # the window closes all the same
            log.warning("could not save the window geometry: %s", e)

    # -- the database: notices, failed writes, quitting on a signal -------------------------

    def _update_title(self) -> None:
        parts = ["Logit Lab"] + ([self._model_title] if self._model_title else [])
        if self.store.temporary:
            parts.append(NOTHING_SAVED)
        self.setWindowTitle(" — ".join(parts))

    def show_database_notice(self, notice: DatabaseNotice) -> QMessageBox:
        """The one dialog about the database at start-up: what was recovered, or what is wrong and what now.

        Opened, not exec()'d: the window stays live (and a test closes it with `database_box.done`).
        """
        icon = QMessageBox.Icon.Warning if notice.temporary else QMessageBox.Icon.Information
        box = QMessageBox(icon, notice.title, notice.text, parent=self)
        box.setObjectName("database_notice")
        box.setAccessibleName(notice.title)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # paths can be copied
        if notice.temporary:
            go_on = box.addButton("Continue without saving", QMessageBox.ButtonRole.AcceptRole)
            quit_button = box.addButton("Quit", QMessageBox.ButtonRole.RejectRole)
            go_on.setObjectName("continue_temporary")
            quit_button.setObjectName("quit")
            quit_button.clicked.connect(self.close)
            box.setDefaultButton(go_on)
            self.banner.show_message("database", f"{notice.title}: running on a temporary database — nothing is saved.")
        else:
            box.addButton(QMessageBox.StandardButton.Ok)
        box.open()
        self.database_box = box
        return box

    def _on_save_failed(self, reason: str) -> None:
        self.banner.show_message(
            "saving",
            f"Saving failed: {reason}. Your conversation is kept in this window; Logit Lab tries again "
            "every few seconds, when you export and when you quit.",
            "Try again",
            self.controller.retry_saving,
        )

    def _on_saved(self) -> None:
        self.banner.clear("saving")
        self.status.showMessage("Everything is saved again.", 6000)

    def _on_damage_read(self, what: str) -> None:
        self.banner.show_message(
            "damage",
            f"The database is damaged: {what}. What could be read is shown. Logit Lab will repair the file when "
            "it next starts (the damaged file is kept).",
        )

    def interrupt(self, reason: str) -> None:
        """Quit as closing the window does, on a signal (SIGTERM, SIGHUP, SIGINT): the answer is marked interrupted."""
        log.info("%s: closing", reason)
        self.controller.interrupt(reason)
        self.close()

    def flush_now(self) -> None:
        """Qt is quitting without the window closing first: write what is pending, now (never raises)."""
        if self._shutdown_done:
            return
        try:
            self.controller.flush_now()
            self.store.checkpoint()
        except Exception:  # noqa: BLE001 - quitting must go on
            log.exception("writing the last tokens failed while quitting")

    def size_to_fit(self, free_width: int, free_height: int) -> None:
        """The first start's size: DEFAULT_SIZE, or the screen's free area where that is smaller (on a
        1024x700 screen a 1400-wide window put the Inspector past its edge), the side panels scaled alike."""
        width, height = min(DEFAULT_SIZE[0], free_width), min(DEFAULT_SIZE[1], free_height)
        self.resize(width, height)
        docks = [size * width // DEFAULT_SIZE[0] for size in DEFAULT_DOCK_WIDTHS]
        self.resizeDocks([self.chats_dock, self.inspector_dock], docks, Qt.Orientation.Horizontal)

    def _restore_geometry(self) -> None:
        saved = self.store.get_setting(GEOMETRY_KEY)
        if not saved:
            screen = self.screen()
            if screen is None:
                self.size_to_fit(*DEFAULT_SIZE)
            else:
                free = screen.availableGeometry()
                self.size_to_fit(free.width(), free.height())
            return
        self.restoreGeometry(QByteArray.fromBase64(saved["geometry"].encode()))
        self.restoreState(QByteArray.fromBase64(saved["state"].encode()))
