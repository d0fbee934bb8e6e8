"""The main window: builds the state, the views and the menus, and turns user actions into async work.

The menus' actions are typed (`WindowActions`) and connected here; what they
do lives apart and gets an `ActionContext` rather than the window: loading
models (`ModelActions`), experiments and exports (`app.actions.experiments`).
Chat actions run as tasks on the qasync loop. Closing while an answer streams
stops it, waits for the last tokens, writes them, then really closes.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Awaitable, Coroutine
from typing import Any, Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QApplication, QDockWidget, QMainWindow, QMessageBox, QVBoxLayout, QWidget,
)

from engine import ModelInfo

from app.actions.context import ActionContext
from app.attachment_actions import AttachmentActions
from app.actions.continue_action import ContinueAction
from app.controllers.chat import Busy, ChatController
from app.controllers.engine_host import EngineHost
from app.actions.experiments import export_conversation, export_trace, open_compare, open_replay, open_score
from app.logs import show_log_file
from app.menus import WindowActions, build_menu_bar, show_about, show_shortcuts
from app.actions.library import open_library
from app.actions.model import ModelActions
from app.controllers.serve import ServeController
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.database.recovery import DatabaseNotice
from app.state.models.servers import ApiKeys
from app.state.settings import Selection, SettingsState, SteeringMemory, ViewOptions
from app.state.database.store import Store
from app.state.database.write_queue import write_queue
from app.theme import Theme, app_icon
from app.database_messages import DatabaseMessages
from app.widgets.banner import Banner
from app.widgets.chat.chat_pane import ChatPane
from app.widgets.inspection.inspector import MIN_WIDTH as INSPECTOR_MIN_WIDTH
from app.widgets.inspection.inspector import Inspector
from app.controllers.loom import LoomController
from app.loom_options import remember_loom_options
from app.widgets.experiment_windows.loom_view import LoomView
from app.widgets.experiment_windows.model_diff_view import open_model_diff
from app.widgets.sampling.sampling_panel import SamplingPanel
from app.widgets.steering.steering_panel import SteeringPanel
from app.state.steering_state import FOLDER_NAME as STEERING_FOLDER, SteeringState
from app.widgets.dialogs.serve_dialog import ServeDialog
from app.widgets.chat.served_bar import ServedBar
from app.widgets.side_scroll import SIDE_PANEL_MIN_WIDTH, downward_scroll, sideways_scroll
from app.widgets.chat.sidebar import Sidebar
from app.widgets.status_bar import StatusBar
from app.widgets.tool_calls.tools_panel import tools_panel_for
from app.state.notebook import generate as continue_notebook, is_notebook
from app.tab_order import DocksOnScreen
from app.actions.templates import TemplateActions
from app.state.template_default import default_system_prompt
from app.widgets.chat.notebook_view import NotebookView
from app.window_layout import DEFAULT_SIZE, restore_layout, save_layout

log = logging.getLogger(__name__)

DEFAULT_DOCK_WIDTHS = (300, 470)  # chats, inspector: their widths in a window of the default size
# The sampling dock never asks for more than SIDE_PANEL_MAX_FLOOR (its panel scrolls sideways inside it): with
# the inspector's 320 and the chat's ~370, the window's minimum width stays well within a 1024-pixel screen.
CHAT_MIN_WIDTH = 400  # a first start's chat column is at least this wide where the screen allows
APPEARANCE_KEY = "appearance"
NOTHING_SAVED = "nothing saved"  # in the title bar while the app runs on a temporary database
APP_NAME = "Logit Lab"  # the application's display name (app/__main__.py), the title's last part


@dataclass(frozen=True)
class DockRow:
    """One side panel: the window builds a dock for each row of DOCKS, in order."""

    attr: str  # the window's attribute that holds the dock
    title: str  # its title and accessible name; lowercased, the dock's object name ("chats_dock")
    content: Callable[[MainWindow], QWidget]  # builds (or hands over) what the dock holds
    area: Qt.DockWidgetArea
    tab_with: str | None = None  # the dock (attribute) whose tabs this one joins
    raise_after: str | None = None  # the dock (attribute) brought to the front once this one is tabbed


LEFT, RIGHT = Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea
# In this order: the order Qt builds them in, and their panels' order in the View menu.
DOCKS: tuple[DockRow, ...] = (
    DockRow("chats_dock", "Chats", lambda window: window.sidebar, LEFT),
    DockRow("sampling_dock", "Sampling", lambda window: window._sampling_sideways(), LEFT, tab_with="chats_dock"),
    DockRow("steering_dock", "Steering", lambda window: window._steering_scroll(), LEFT, tab_with="sampling_dock",
            raise_after="chats_dock"),
    DockRow("inspector_dock", "Inspector", lambda window: window.inspector, RIGHT),
    DockRow("loom_dock", "Loom", lambda window: window._loom_view(), RIGHT, tab_with="inspector_dock",
            raise_after="inspector_dock"),
    DockRow("tools_dock", "Tools", lambda window: window._tools_panel(), RIGHT, tab_with="loom_dock", raise_after="inspector_dock"),
)


class MainWindow(QMainWindow):
    closed = Signal()  # after the last tokens are written

    chats_dock: QDockWidget  # the docks, built from DOCKS
    sampling_dock: QDockWidget
    steering_dock: QDockWidget
    inspector_dock: QDockWidget
    loom_dock: QDockWidget
    sidebar: Sidebar  # two panels the docks hold as they are
    inspector: Inspector

    def __init__(self, store: Store, host: EngineHost, theme: Theme | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Logit Lab")
        self.setWindowIcon(app_icon())
        self._build_state(store, host, theme)
        self._build_central()
        self._build_docks()
        self._build_status_and_menus()
        self._connect_chat()
        self._connect_state()
        self.library.open_last()
        restore_layout(self)
        self._on_busy_changed(False)
        self._update_title()
        self.focus_input()  # without it Qt focused the first control (the heatmap box), and typing went nowhere

    def _build_state(self, store: Store, host: EngineHost, theme: Theme | None) -> None:
        """The window's state and controllers, before any view."""
        self.store = store
        self.host = host
        self.theme = theme
        self.library = Library(store)
        self.settings = SettingsState(store)
        self.api_keys = ApiKeys()  # server keys: the OS keyring when installed, else this session only
        self.view_options = ViewOptions(store)
        self.selection = Selection()
        # Steering vectors are kept beside the database (none for a temporary one): a replay finds them.
        steering_folder = None if store.temporary else Path(store.path).parent / STEERING_FOLDER
        self.controller = ChatController(self.library, self.settings, host, steering=SteeringState(steering_folder))
        self.steering_memory = SteeringMemory(store, self.controller.steering)  # strengths and range across restarts
        self.serving = ServeController(self.library, host)  # Model ▸ Serve…: its requests become conversations
        self.serve_dialog: ServeDialog | None = None
        self._model_title = host.info.name if host.info is not None else ""
        self._closing = False
        self._shutdown_done = False
        self._tasks: set[asyncio.Future] = set()
        self._docks_on_screen = DocksOnScreen(self)  # Tab skips the docks that are closed or tabbed away

    def _build_central(self) -> None:
        """The middle column: the banner, the served bar, then the chat or (in its place) the notebook."""
        self.chat = ChatPane(self.library, self.view_options, self.selection, self.controller)
        self.banner = Banner()
        central = QWidget()
        column = QVBoxLayout(central)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.banner)
        self.served_bar = ServedBar(self.library, self.serving, lambda coro: self._spawn(coro))
        column.addWidget(self.served_bar)
        column.addWidget(self.chat, 1)
        # A notebook (app/state/notebook.py) shows in place of the chat: one text the model continues.
        self.notebook = NotebookView(self.library, self.view_options, self.selection, self.controller)
        column.addWidget(self.notebook, 1)
        self.setCentralWidget(central)

    def _build_docks(self) -> None:
        """The side panels, one dock per row of DOCKS, tabbed and raised as the table says."""
        self.sidebar = Sidebar(self.library)
        self.sampling = SamplingPanel(self.settings, self.controller)
        self.inspector = Inspector(self.library, self.selection, self.controller)
        for row in DOCKS:
            dock = self._dock(row.title, row.content(self), row.area)
            setattr(self, row.attr, dock)
            if row.tab_with is not None:
                self.tabifyDockWidget(getattr(self, row.tab_with), dock)
            if row.raise_after is not None:
                getattr(self, row.raise_after).raise_()

    def _sampling_sideways(self) -> QWidget:
        """The sampling panel in a sideways scroll area (the panel's own one scrolls down)."""
        return sideways_scroll(self.sampling, self.sampling.min_width_changed, "sampling_sideways", "Sampling settings")

    def _steering_scroll(self) -> QWidget:
        """The steering panel, in a scroll area: its rows grow with the vectors, it scrolls down, never widens."""
        self.steering_panel = SteeringPanel(self.controller.steering, self.controller.steering_jobs, self.store,
                                            lambda coro: self._spawn(coro))
        return downward_scroll(self.steering_panel, "steering_scroll", "Steering vectors")

    def _tools_panel(self) -> QWidget:
        """The Tools dock (issue 45): the chat's tools, MCP servers and the call blocks' actions."""
        return tools_panel_for(self.store, self.library, self.controller, self.chat, self._spawn, self.closed)

    def _loom_view(self) -> QWidget:
        """The loom (issue 25): its controller and view, a tab beside the Inspector."""
        self.loom = LoomController(self.controller)
        self.loom_view = LoomView(self.loom, self.selection)
        remember_loom_options(self.loom_view, self.store)  # its budget and the rest survive a restart
        return self.loom_view

    def _build_status_and_menus(self) -> None:
        """The status bar, the template actions, the action context, the menus and what their actions do."""
        self.status = StatusBar(self.host, self.controller)
        self.setStatusBar(self.status)
        self.serving.changed.connect(self.status.show_serving)
        self.serving.problem.connect(lambda text: self.status.showMessage(text[:1].upper() + text[1:], 15000))
        # The system prompt box shows what the template says when it is empty; the templates' refresh names it.
        self.status.template_shown.connect(self._read_template_default)
        self.templates = TemplateActions(self.store, self.host, self.library, self.status, self)
        # Menus and actions get this context, never the window: they are imported here, not the reverse.
        self.context = ActionContext(
            store=self.store, library=self.library, selection=self.selection, host=self.host,
            settings=self.settings, parent=self, notify=self.status.showMessage, spawn=self._spawn,
            steering=self.controller.steering,
        )
        # Typed, and named apart from QWidget.actions() (the list Qt keeps), which must stay a method.
        self.menu_actions = actions = WindowActions.create(self)
        panels = [getattr(self, row.attr).toggleViewAction() for row in DOCKS]
        self._menus = build_menu_bar(self, actions, panels, appearance=self.theme is not None)
        self.models = ModelActions(
            self.context, self.api_keys, (actions.open_model, actions.connect_server, actions.runtime_settings)
        )
        self._connect_actions()

    def _connect_chat(self) -> None:
        """The composer, the chat view, the inspector, the sidebar and the notebook to the window's slots."""
        composer = self.chat.composer
        composer.send_requested.connect(self.on_send)
        # The paperclip's dialog, the chips' tokens and whether the files fit the context (app/attachment_actions.py).
        self.attachment_actions = AttachmentActions(self, composer, self.host, self.store, self.status, composer.submit)
        composer.stop_requested.connect(self.controller.stop)
        # An invalid (or unchecked) structured-output constraint: Send waits and says why, the text stays.
        self.settings.constraint_problem_changed.connect(composer.set_blocked)
        composer.set_blocked(self.settings.constraint_problem)
        view = self.chat.chat_view
        view.regenerate_requested.connect(self.on_regenerate)
        view.continue_requested.connect(self.on_continue)
        view.edit_submitted.connect(self.on_edit_submitted)
        self.inspector.branch_requested.connect(self.on_branch)
        self.inspector.continuations_requested.connect(self.loom_view.continuations_at)
        self.sidebar.new_requested.connect(self.new_chat)
        self.notebook.generate_requested.connect(self.on_generate_notebook)
        self.notebook.stop_requested.connect(self.controller.stop)
        self.library.current_changed.connect(self._show_mode)
        self._show_mode(self.library.current)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.selection.changed.connect(self._on_selection_changed)

    def _connect_state(self) -> None:
        """The controller's, the store's and the host's signals: messages in the status bar, the busy state."""
        store, controller = self.store, self.controller
        controller.error.connect(lambda text: self.status.showMessage(f"Generation failed: {text}", 15000))
        controller.notice.connect(lambda text: self.status.showMessage(text[:1].upper() + text[1:], 15000))
        # The database's notices, failed and resumed saves, a held lock, damage: app.database_messages.
        self.database = DatabaseMessages(self, self.banner, self.status, store, controller.retry_saving)
        # An action that waited for the lock and then failed for another reason: said, never a traceback.
        write_queue(store).failed = lambda what, why: self.status.showMessage(f"Not done: {what}: {why}", 15000)
        controller.busy_changed.connect(self._on_busy_changed)
        # Continue names the answer it acts on, and is off with the reason when there is none.
        self.continue_action = ContinueAction(self.menu_actions.continue_answer, self.library, controller.busy_changed)
        controller.save_failed.connect(self.database.save_failed)
        controller.saved.connect(self.database.saved)
        controller.started.connect(self._on_generation_started)
        # The host can outlive this window (tests open a second one on it): closing disconnects these.
        self.host.model_changed.connect(self._on_model_changed)

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"{title.lower()}_dock")
        dock.setWidget(widget)
        dock.setAccessibleName(title)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(area, dock)
        self._docks_on_screen.follow(dock)  # Tab skips what a closed or tabbed-away dock holds
        return dock

    def focusNextPrevChild(self, next: bool) -> bool:
        """Tab and Shift+Tab go only through what is on screen (app/tab_order.py)."""
        return self._docks_on_screen.move_focus(lambda: super(MainWindow, self).focusNextPrevChild(next))

    def _connect_actions(self) -> None:
        """What each menu action does: the window's own slots, the model actions, the experiment actions."""
        a, ctx = self.menu_actions, self.context
        handlers = {
            a.new_chat: self.new_chat,
            a.new_notebook: self.new_notebook,
            a.chat_template: self.templates.open_dialog,
            a.export_markdown: lambda: self.export("markdown"),
            a.export_json: lambda: self.export("json"),
            a.export_trace: lambda: export_trace(ctx),
            a.quit: self.close,
            a.send: self._send_or_generate,
            a.stop: self.stop,
            a.regenerate: self.on_regenerate,
            a.continue_answer: self.on_continue,
            a.search: self._focus_search,
            a.rename: self.sidebar.begin_rename,
            a.compare: lambda: open_compare(ctx),
            a.replay: lambda: open_replay(ctx, False),
            a.replay_with: lambda: open_replay(ctx, True),
            a.score: lambda: open_score(ctx),
            a.compare_models: lambda: open_model_diff(ctx.host, ctx.store, ctx.parent),
            a.open_model: self.models.open_model_dialog,
            a.library: lambda: open_library(ctx, self.models),
            a.connect_server: self.models.open_connect_dialog,
            a.serve: self.open_serve_dialog,
            a.runtime_settings: self.models.open_runtime_dialog,
            a.heatmap: self.toggle_heatmap,
            a.previous_token: lambda: self.inspector.step(-1),
            a.next_token: lambda: self.inspector.step(+1),
            a.log_file: lambda: show_log_file(self),
            a.shortcuts: lambda: show_shortcuts(self),
            a.about: lambda: show_about(self),
        }
        for action, handler in handlers.items():
            action.triggered.connect(lambda _checked=False, run=handler: run())
        a.heatmap.setChecked(self.view_options.heatmap)
        self.view_options.changed.connect(lambda: a.heatmap.setChecked(self.view_options.heatmap))
        self._menus.model.aboutToShow.connect(lambda: self.models.fill_recent(self._menus.recent))
        self.models.fill_recent(self._menus.recent)
        for scheme, action in self._menus.appearance.items():
            action.setChecked(self.theme is not None and self.theme.scheme == scheme)
            action.triggered.connect(lambda _checked=False, s=scheme: self.set_appearance(s))

    def open_serve_dialog(self) -> ServeDialog:
        """Model ▸ Serve…: one dialog at a time (asking again raises it), deleted once closed."""
        if self.serve_dialog is not None:
            self.serve_dialog.raise_()
            self.serve_dialog.activateWindow()
            return self.serve_dialog
        dialog = self.serve_dialog = ServeDialog(self.serving, self._spawn, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(lambda _result: setattr(self, "serve_dialog", None))
        dialog.open()
        return dialog

    def _focus_search(self) -> None:
        self.chats_dock.show()
        self.chats_dock.raise_()
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    # -- model -----------------------------------------------------------------------------

    def start(self, spec: str | None = None, backend: str | None = None) -> asyncio.Future:
        """Load the model given on the command line, else the last one used, else the default."""
        return self.models.start(spec, backend)

    def _on_model_changed(self, info: ModelInfo) -> None:
        self._model_title = info.name
        self._update_title()

    def _read_template_default(self) -> None:
        """Read the loaded model's default system prompt off the UI thread (a template render), then show it."""
        engine = self.host.engine
        if engine is None or not engine.is_loaded:
            self.chat.set_template_default("")
            return
        tokenizer = engine.tokenizer
        self.host.run_off_ui_thread(lambda: default_system_prompt(tokenizer), self._show_template_default)

    def _show_template_default(self, text: str | None, _error: BaseException | None) -> None:
        if not self._shutdown_done:  # the window may have closed while the template was read
            self.chat.set_template_default(text or "")

    # -- chat actions ----------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            e = task.exception()
            if isinstance(e, sqlite3.Error):  # a write outside a generation (a new message, a rename)
                self.database.save_failed(f"{e}")
            elif isinstance(e, (Busy, ValueError)):
                self.status.showMessage(str(e), 8000)
            else:
                log.error("action failed", exc_info=e)
                self.status.showMessage(f"Something went wrong: {e}", 15000)

    def on_send(self, text: str) -> asyncio.Task:
        self.chat.chat_view.scroll_to_bottom()
        attachments = self.chat.composer.take_sent_attachments()  # the files the composer sent with the text
        return self._spawn(self._after_waiting_actions(self.controller.send, text, attachments))

    def on_regenerate(self, message: Message | None = None) -> asyncio.Task:
        if message is None:  # "the last answer shown": shown once the chat actions asked for before have run
            return self._spawn(self._after_waiting_actions(self.controller.regenerate, None))
        return self._spawn(self.controller.regenerate(message))

    async def _after_waiting_actions(self, run: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        # A New chat or a switch that waits for the database's write lock (app/state/database/write_queue.py) decides which
        # chat is open; a message sent meanwhile belongs to the chat the person will see, so it waits its turn.
        await write_queue(self.store).drained()
        return await run(*args)

    def on_continue(self, message: Message | None = None) -> asyncio.Task | None:
        """Continue `message` (an answer's More button); None: the last answer of the branch on screen, only when
        it was cut off (app/state/continue_target.py). An answer that later turns follow is continued as a new
        version (app/controllers/chat.py)."""
        if message is None:
            target = self.continue_action.target()
            if target.message is None:
                self.status.showMessage(target.tip, 8000)
                return None
            message = target.message
        return self._spawn(self.controller.continue_answer(message))

    def on_edit_submitted(self, message: Message, text: str) -> asyncio.Task:
        return self._spawn(self.controller.edit_and_resend(message, text))

    def on_branch(self, message: Message, index: int, token_id: int) -> asyncio.Task:
        return self._spawn(self.controller.branch(message, index, token_id))

    def _on_generation_started(self, message: Message) -> None:
        # Its tokens are loaded by now (a branch's kept part is set, a continued answer's read, before it starts).
        tokens = message.tokens
        if message.branch_index is not None and tokens is not None and not tokens[message.branch_index:]:
            # A new branch: select its forced token, so the inspector follows the branch.
            self.selection.set(message.id, message.branch_index)

    def stop(self) -> None:
        self.controller.stop()

    def new_chat(self) -> None:
        # Another connection holding the write lock: the new chat is made once it is free (app/state/database/write_queue.py).
        write_queue(self.store).run("making a new chat", self.library.new)
        self.focus_input()

    def new_notebook(self) -> None:
        write_queue(self.store).run("making a new notebook", lambda: self.library.new(mode="notebook"))
        self.focus_input()

    def focus_input(self) -> None:
        """Typing goes where text is written: the composer, or a notebook's text (at start, after Ctrl+N)."""
        target = self.notebook.editor if is_notebook(self.library.current) else self.chat.composer.edit
        target.setFocus(Qt.FocusReason.OtherFocusReason)

    def on_generate_notebook(self, text: str) -> asyncio.Task | None:
        conv = self.library.current
        return self._spawn(self._generate_notebook(conv, text)) if conv is not None and is_notebook(conv) else None

    async def _generate_notebook(self, conv: Conversation, text: str) -> Message:
        # Its text is written first: while another connection holds the write lock (or an earlier edit waits for
        # it) this waits on the event loop, the status bar says so (app/state/database/write_queue.py).
        await write_queue(self.store).settled()
        return await continue_notebook(self.controller, conv, text)

    def _send_or_generate(self) -> None:
        if is_notebook(self.library.current):
            self.notebook.request_generate()
        else:
            self.chat.composer.submit()

    def _show_mode(self, conv: Conversation | None) -> None:
        notebook = is_notebook(conv)
        inputs = (self.chat.composer.edit, self.notebook.editor)
        typing = QApplication.focusWidget() in inputs  # read before hiding one moves the focus elsewhere
        self.notebook.setVisible(notebook)
        self.chat.setVisible(not notebook)
        if typing:  # e.g. a base model turned the empty chat into a notebook: the typing goes there
            self.focus_input()

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a conversation; an answer streaming into it stops first, whichever conversation is open."""
        generating = self.controller.generating_message
        if generating is not None and any(row.id == generating.id for row in self.store.messages(conversation_id)):
            self.controller.stop()
        write_queue(self.store).run("deleting the chat", lambda: self.library.delete(conversation_id))

    def toggle_heatmap(self) -> None:
        self.view_options.set_heatmap(not self.view_options.heatmap)

    def export(self, kind: str, path: str | Path | None = None) -> Path | None:
        """File ▸ Export as Markdown / JSON: the open conversation; None when cancelled or not written."""
        self.controller.retry_saving()  # export is a moment to try again what could not be saved
        return export_conversation(self.context, kind, path)

    def set_appearance(self, scheme: str) -> None:
        if self.theme is not None:
            self.theme.set_scheme(scheme)
            self.store.put_setting(APPEARANCE_KEY, scheme)

    # -- reactions -------------------------------------------------------------------------

    def _on_selection_changed(self, message_id: int | None, _index: int | None) -> None:
        if message_id is not None and not self.inspector_dock.isVisible():
            self.inspector_dock.show()

    def _on_busy_changed(self, busy: bool) -> None:
        a = self.menu_actions
        a.stop.setEnabled(busy)
        a.regenerate.setEnabled(not busy)

    # -- closing ---------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._shutdown_done:
            save_layout(self)
            self.host.model_changed.disconnect(self._on_model_changed)
            self.models.detach()
            self.database.detach()
            self.status.detach()
            self.attachment_actions.detach()
            self.templates.detach()
            self.served_bar.detach()
            self.serving.detach()
            event.accept()
            self.closed.emit()
            return
        event.ignore()
        if not self._closing:
            self._closing = True
            self.notebook.commit_draft()  # what was typed in a notebook is kept
            save_layout(self)
            self.hide()
            asyncio.ensure_future(self._shutdown())

    async def _shutdown(self) -> None:
        self.loom.stop()
        self.controller.steering_jobs.cancel_training()  # stops between batches: the model is free to close
        try:  # first: no client gets a new answer, and what was served is written
            await self.serving.stop("the window closed")
        except Exception:  # noqa: BLE001 - closing must finish
            log.exception("stopping the server failed while closing")
        try:
            await self.controller.shutdown()
        except Exception:  # noqa: BLE001 - closing must finish
            log.exception("stopping the generation failed while closing")
        finally:
            self._shutdown_done = True
            self.close()

    # -- the database: notices, failed writes, quitting on a signal -------------------------

    def _update_title(self) -> None:
        """"<model> — Logit Lab": the app's name last, where Qt appends the display name itself (on Linux and
        Windows) unless the title already ends with it ("Logit Lab — X — Logit Lab" before)."""
        parts = ([self._model_title] if self._model_title else []) + ([NOTHING_SAVED] if self.store.temporary else [])
        self.setWindowTitle(" — ".join([*parts, APP_NAME]))

    def show_database_notice(self, notice: DatabaseNotice) -> QMessageBox:
        """The one dialog about the database at start-up (app.database_messages); `database_box` holds it."""
        return self.database.show_notice(notice, self.close)

    @property
    def database_box(self) -> QMessageBox | None:
        return self.database.notice_box

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
            if self.serving.recorder is not None:  # what the server said last is written too
                self.serving.recorder.drain("quit")
            self.controller.flush_now()
            self.store.checkpoint()
        except Exception:  # noqa: BLE001 - quitting must go on
            log.exception("writing the last tokens failed while quitting")

    def size_to_fit(self, free_width: int, free_height: int) -> None:
        """The first start's size: DEFAULT_SIZE, or the screen's free area where that is smaller (on a
        1024x700 screen a 1400-wide window put the Inspector past its edge), the side panels scaled alike."""
        width, height = min(DEFAULT_SIZE[0], free_width), min(DEFAULT_SIZE[1], free_height)
        self.resize(width, height)
        left, right = (size * width // DEFAULT_SIZE[0] for size in DEFAULT_DOCK_WIDTHS)
        # The sampling panel's whole width where the chat keeps a readable column beside it; else it scrolls sideways.
        room = width - right - CHAT_MIN_WIDTH
        left = max(left, min(self.sampling.minimumWidth(), room))
        right = max(INSPECTOR_MIN_WIDTH, min(right, width - max(left, SIDE_PANEL_MIN_WIDTH) - CHAT_MIN_WIDTH))
        self.resizeDocks([self.chats_dock, self.inspector_dock], [left, right], Qt.Orientation.Horizontal)
