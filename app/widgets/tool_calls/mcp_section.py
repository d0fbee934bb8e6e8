"""The Tools panel's MCP part: load an mcp.json (LM Studio's and Claude Desktop's format), each server's state
in words (running with its tools, or why not), and its tools on or off for this chat.

Servers start only when the user loads a file; each call of their tools waits for the user's approval in its
block (app/controllers/tool_loop.py) and times out after `CALL_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

from app.state.database.store import Store
from app.tool_calls.mcp_state import CALL_TIMEOUT_S, McpState, describe_server
from app.tool_calls.panel_state import ToolsPanelState
from app.widgets.dialogs.file_dialogs import open_file


class McpSection(QWidget):
    def __init__(self, mcp: McpState, state: ToolsPanelState, store: Store,
                 spawn: Callable[[Any], Any] = asyncio.ensure_future, parent: QWidget | None = None):
        super().__init__(parent)
        self.mcp, self.state, self.store, self.spawn = mcp, state, store, spawn
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 6, 0, 0)
        self.load_button = QPushButton("Load mcp.json…")
        self.load_button.setToolTip('MCP servers: {"mcpServers": {"name": {"command": ..., "args": [...]} or {"url": ...}}}')
        self.load_button.clicked.connect(self._choose_file)
        layout.addWidget(self.load_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.status_label = QLabel()
        self.status_label.setTextFormat(Qt.TextFormat.PlainText)  # a server's error may quote its output
        self.status_label.setWordWrap(True)
        self.status_label.setAccessibleName("MCP servers")
        layout.addWidget(self.status_label)
        self.server_list = QListWidget()
        self.server_list.setAccessibleName("MCP servers and their tools")
        self.server_list.itemChanged.connect(self._on_item_changed)
        layout.addWidget(self.server_list, 1)
        note = QLabel(f"Each call waits for your approval; a call ends after {CALL_TIMEOUT_S:g} s.")
        note.setWordWrap(True)
        note.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        layout.addWidget(note)
        self._filling = False
        mcp.changed.connect(self.refresh)
        state.changed.connect(self.refresh)
        self.refresh()

    def _choose_file(self) -> None:
        path = open_file(self, self.store, "mcp", "Load MCP servers", "MCP config (*.json);;All files (*)")
        if path is not None:
            self.spawn(self.mcp.load(path))

    def refresh(self) -> None:
        mcp = self.mcp
        if mcp.starting:
            head = "Starting the MCP servers…"
        elif mcp.error:
            head = mcp.error
        elif mcp.statuses:
            head = f"{mcp.source}:\n" + "\n".join(describe_server(s) for s in mcp.statuses)
        else:
            head = "No MCP servers: load an mcp.json."
        self.status_label.setText(head)
        on = self.state.tools.mcp_enabled
        self._filling = True
        try:
            self.server_list.clear()
            for status in mcp.statuses:
                for spec in status.tools if status.ok else ():
                    item = QListWidgetItem(f"{spec.name}  ({status.name})")
                    item.setData(Qt.ItemDataRole.UserRole, spec.name)
                    item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                    item.setCheckState(Qt.CheckState.Checked if spec.name in on else Qt.CheckState.Unchecked)
                    item.setToolTip(spec.description or "(no description)")
                    self.server_list.addItem(item)
        finally:
            self._filling = False
        self.server_list.setVisible(self.server_list.count() > 0)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if not self._filling:
            self.state.set_mcp_enabled(item.data(Qt.ItemDataRole.UserRole), item.checkState() == Qt.CheckState.Checked)
