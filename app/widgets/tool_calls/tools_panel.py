"""The Tools panel: the open chat's tools (from a tools.json), each on or off, the tool choice, and the MCP
servers with their tools (when the window has an MCP hub: app/widgets/tool_calls/mcp_section.py).

What it changes is kept with the chat (app/tool_calls/panel_state.py); a tools file that is wrong is one line
under the button, naming the field, and the chat's tools stay as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, SignalInstance
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.state.database.store import Store
from app.tool_calls.mcp_state import McpState
from app.tool_calls.panel_state import ToolsPanelState
from app.tool_calls.requests import ToolRequests
from app.widgets.dialogs.file_dialogs import open_file

if TYPE_CHECKING:
    from app.controllers.tool_calls import ToolCallActions
    from app.controllers.chat import ChatController
    from app.state.conversation_list import Library
    from app.widgets.chat.chat_pane import ChatPane

CHOICE_LABELS = {"auto": "auto: the model decides", "required": "required: it must call one",
                 "none": "none: answer in text"}


def _plain_label(text: str = "", name: str = "") -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)  # file names and errors are shown as written, never as markup
    label.setWordWrap(True)
    if name:
        label.setAccessibleName(name)
    return label


class ToolsPanel(QWidget):
    def __init__(self, state: ToolsPanelState, store: Store, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.store = store
        self.requests: ToolRequests | None = None  # set by tools_panel_for: the chat's tools in its requests
        self.mcp: McpState | None = None  # ... the MCP servers
        self.call_actions: ToolCallActions | None = None  # ... and what the call blocks' buttons do
        self.setObjectName("tools_panel")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self._build_file_row(layout)
        self.tool_list = QListWidget()
        self.tool_list.setAccessibleName("Tools of this chat")
        self.tool_list.itemChanged.connect(self._on_item_changed)
        layout.addWidget(self.tool_list, 1)
        self._build_choice_row(layout)
        self.extra = QVBoxLayout()  # the MCP section goes here when the window has a hub
        layout.addLayout(self.extra)
        self._filling = False
        state.changed.connect(self.refresh)
        self.refresh()

    def _build_file_row(self, layout: QVBoxLayout) -> None:
        row = QHBoxLayout()
        self.load_button = QPushButton("Load tools.json…")
        self.load_button.setToolTip("Function definitions in OpenAI's shape: "
                                    '[{"type": "function", "function": {"name", "description", "parameters"}}]')
        self.load_button.clicked.connect(self._choose_file)
        row.addWidget(self.load_button)
        row.addStretch(1)
        layout.addLayout(row)
        self.source_label = _plain_label(name="Tools file")
        self.source_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        layout.addWidget(self.source_label)
        self.error_label = _plain_label(name="Tools file error")
        self.error_label.setStyleSheet("color: #c0392b;")
        layout.addWidget(self.error_label)

    def _build_choice_row(self, layout: QVBoxLayout) -> None:
        row = QHBoxLayout()
        row.addWidget(QLabel("Tool choice"))
        self.choice_box = QComboBox()
        self.choice_box.setAccessibleName("Tool choice")
        self.choice_box.currentIndexChanged.connect(self._on_choice)
        row.addWidget(self.choice_box, 1)
        layout.addLayout(row)

    def _choose_file(self) -> None:
        path = open_file(self, self.store, "tools", "Load tools", "Tools (*.json);;All files (*)")
        if path is not None:
            self.state.load_file(path)

    def refresh(self) -> None:
        """Show the open chat's tools, choice and the last file error."""
        settings = self.state.tools
        self._filling = True
        try:
            self.tool_list.clear()
            for d in settings.definitions:
                fn = d["function"]
                item = QListWidgetItem(fn["name"])
                item.setData(Qt.ItemDataRole.UserRole, fn["name"])
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                on = fn["name"] in settings.enabled
                item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
                item.setToolTip(fn.get("description") or "(no description)")
                self.tool_list.addItem(item)
            self.choice_box.clear()
            choices = ["auto", "required", "none"] + sorted(settings.enabled)
            for c in choices:
                self.choice_box.addItem(CHOICE_LABELS.get(c, f"call {c}"), c)
            self.choice_box.setCurrentIndex(max(0, choices.index(settings.choice) if settings.choice in choices else 0))
        finally:
            self._filling = False
        n = len(settings.enabled)
        self.source_label.setText(f"{settings.source} · {n} of {len(settings.definitions)} on" if settings.definitions
                                  else "No tools loaded for this chat.")
        self.error_label.setText(self.state.error)
        self.error_label.setVisible(bool(self.state.error))

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if not self._filling:
            self.state.set_enabled(item.data(Qt.ItemDataRole.UserRole), item.checkState() == Qt.CheckState.Checked)

    def _on_choice(self, index: int) -> None:
        if not self._filling and index >= 0:
            self.state.set_choice(self.choice_box.itemData(index))


def tools_panel_for(store: Store, library: Library, controller: ChatController, chat: ChatPane,
                    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
                    closed: SignalInstance) -> ToolsPanel:
    """The Tools dock's panel, with the chat's tools put in its requests, the call blocks' actions and the MCP
    tool loop wired: `spawn` runs an action as the window's others (a failure said in the status bar), `closed`
    is the window's last signal (the MCP servers are closed then)."""
    from app.controllers.tool_calls import ToolCallActions  # the panel's half of the window: built with it
    from app.controllers.tool_loop import ToolLoop
    from app.widgets.tool_calls.mcp_section import McpSection

    mcp = McpState()
    requests = ToolRequests(store, mcp.tools)
    controller.tool_requests = requests
    state = ToolsPanelState(library)
    panel = ToolsPanel(state, store)
    panel.requests, panel.mcp = requests, mcp
    panel.call_actions = actions = ToolCallActions(controller, requests, store)
    actions.spawn = spawn
    actions.loop = loop = ToolLoop(controller, mcp, state)
    loop.spawn = spawn
    loop.changed.connect(lambda message: _redraw(library, message))
    chat.composer.stop_requested.connect(loop.stop)  # Stop ends a running tool call too
    closed.connect(mcp.close_soon)
    panel.extra.addWidget(McpSection(mcp, state, store, spawn))
    chat.chat_view.tool_actions = actions
    return panel


def _redraw(library: Library, message: object) -> None:
    """A call's state changed (waiting, running): its block shows it (the message's widget is refreshed)."""
    conv = library.current
    if conv is not None and conv.messages.get(getattr(message, "id", -1)) is message:
        conv.message_changed.emit(message)
