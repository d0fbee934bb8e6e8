"""The approval row of an MCP call's block: Allow once / Always for this tool / Deny, "running… Stop" while the
tool runs, and the step limit said in words (app/controllers/tool_loop.py decides what each does)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.controllers.tool_loop import STEP_LIMIT_TEXT
from app.tool_calls.mcp_state import CALL_TIMEOUT_S


class ApprovalRow(QWidget):
    """`decide(decision)` runs for a button ("once", "always", "deny"); `stop()` for Stop."""

    def __init__(self, tool: str, server: str, decide: Callable[[str], object], stop: Callable[[], None],
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Approve the tool call")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 2, 0, 2)
        self.note = QLabel()
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        self.note.setWordWrap(True)
        outer.addWidget(self.note)
        row = QHBoxLayout()
        self.allow_once = QPushButton("Allow once")
        self.allow_always = QPushButton("Always for this tool")
        self.deny = QPushButton("Deny")
        self.stop_button = QPushButton("Stop")
        self.allow_once.setToolTip(f"Run {tool} on {server} this time (it times out after {CALL_TIMEOUT_S:g} s)")
        self.allow_always.setToolTip(f"Run {tool} now and, in this chat, without asking again")
        self.deny.setToolTip("Do not run it: the model is told the user denied the call")
        self.stop_button.setToolTip("End the running call now")
        for b, decision in ((self.allow_once, "once"), (self.allow_always, "always"), (self.deny, "deny")):
            b.clicked.connect(lambda _=False, d=decision: decide(d))
            row.addWidget(b)
        self.stop_button.clicked.connect(stop)
        row.addWidget(self.stop_button)
        row.addStretch(1)
        outer.addLayout(row)
        self._tool, self._server = tool, server

    def show_state(self, state: str | None) -> None:
        """None or "approval": ask; "running": only Stop; "limit": the step limit said, and ask."""
        running = state == "running"
        for b in (self.allow_once, self.allow_always, self.deny):
            b.setVisible(not running)
        self.stop_button.setVisible(running)
        if running:
            self.note.setText(f"running {self._tool} on {self._server}… (at most {CALL_TIMEOUT_S:g} s)")
        elif state == "limit":
            self.note.setText(STEP_LIMIT_TEXT)
        else:
            self.note.setText(f"The model asks to run {self._tool} on the MCP server {self._server!r}. Allow it?")
