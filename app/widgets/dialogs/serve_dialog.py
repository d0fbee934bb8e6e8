"""Model ▸ Serve…: where to serve the model (address, port, API key, an upstream to forward to), start and stop.

It draws the `ServeController`'s state and asks it to start or stop; it never starts a server itself.
Opened with `open()` (never `exec()`), one at a time, deleted once closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout,
    QWidget,
)

from app.controllers.serve import ServeController, ServeError, ServeSettings, ServeState, is_loopback
from engine import TOP_LOGPROBS_MAX

KEY_HINT = ("Clients send it as “Authorization: Bearer KEY”. Needed for any address other than 127.0.0.1: "
            "anyone who can reach this machine could use the model otherwise.")
UPSTREAM_HINT = ("Optional. Forward every request to another OpenAI-compatible server (vLLM, llama.cpp, Ollama) "
                 "and record what it answers instead of serving the loaded model.")
UPSTREAM_TOP_HINT = ("The alternatives per token asked of the upstream for the record, whatever each client asks. "
                     "“What clients ask” adds nothing: asking a llama.cpp server for the top 20 makes an answer "
                     "several times slower and can change its greedy text.")
CLIENTS_OWN = -1  # the spin box's lowest value: ask the upstream only what each client asks


class ServeDialog(QDialog):
    def __init__(self, controller: ServeController, spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("serve_dialog")
        self.setWindowTitle("Serve the model")
        self.setAccessibleName("Serve the model")
        self._controller = controller
        self._spawn = spawn
        saved = controller.saved_settings()

        intro = QLabel("Any OpenAI client (the openai package, SillyTavern, Open WebUI, an editor) can use the "
                       "loaded model at the address below. Every answer it gets appears in the chats list, "
                       "each token inspectable.")
        intro.setWordWrap(True)
        self.host_edit = QLineEdit(saved.host)
        self.host_edit.setAccessibleName("Address to listen on")
        self.host_edit.setToolTip("127.0.0.1: this machine only. 0.0.0.0: every network this machine is on.")
        self.port_box = QSpinBox()
        self.port_box.setRange(0, 65535)
        self.port_box.setValue(saved.port)
        self.port_box.setAccessibleName("Port")
        self.port_box.setToolTip("0 picks a free port")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setAccessibleName("API key")
        self.key_hint = QLabel(KEY_HINT)
        self.key_hint.setWordWrap(True)
        self._make_upstream_fields(saved)

        form = QFormLayout()
        form.addRow("Address", self.host_edit)
        form.addRow("Port", self.port_box)
        form.addRow("API key", self.key_edit)
        form.addRow("", self.key_hint)
        form.addRow("Upstream", self.upstream_edit)
        form.addRow("Upstream top N", self.upstream_top_box)

        self.url_edit = QLineEdit()  # read-only but selectable: the address is there to be copied
        self.url_edit.setReadOnly(True)
        self.url_edit.setAccessibleName("Server address")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setAccessibleName("Copy the server address")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url_edit.text()))
        url_row = QHBoxLayout()
        url_row.addWidget(self.url_edit, 1)
        url_row.addWidget(self.copy_button)
        self.url_row = QWidget()
        self.url_row.setLayout(url_row)
        url_row.setContentsMargins(0, 0, 0, 0)

        self.message = QLabel()
        self.message.setTextFormat(Qt.TextFormat.PlainText)  # errors quote addresses and exceptions
        self.message.setWordWrap(True)
        self.message.setAccessibleName("Serving state")

        self.start_button = QPushButton("Start serving")
        self.stop_button = QPushButton("Stop serving")
        self.start_button.setDefault(True)
        self.start_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(self.start_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(self.stop_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)

        lay = QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addLayout(form)
        lay.addWidget(self.url_row)
        lay.addWidget(self.message)
        lay.addWidget(buttons)

        self.host_edit.textChanged.connect(self._update_key_hint)
        self.upstream_edit.textChanged.connect(lambda _text: self._on_state(controller.state))
        controller.changed.connect(self._on_state)
        self.finished.connect(lambda _result: controller.changed.disconnect(self._on_state))
        self._update_key_hint()
        self._on_state(controller.state)

    def _make_upstream_fields(self, saved: ServeSettings) -> None:
        """Proxy mode's fields: the upstream's address and the alternatives asked of it."""
        self.upstream_edit = QLineEdit(saved.upstream)
        self.upstream_edit.setPlaceholderText("http://127.0.0.1:8000/v1")
        self.upstream_edit.setAccessibleName("Upstream server (optional)")
        self.upstream_edit.setToolTip(UPSTREAM_HINT)
        self.upstream_top_box = QSpinBox()
        self.upstream_top_box.setRange(CLIENTS_OWN, TOP_LOGPROBS_MAX)
        self.upstream_top_box.setSpecialValueText("What clients ask")
        self.upstream_top_box.setValue(CLIENTS_OWN if saved.upstream_top_n is None else saved.upstream_top_n)
        self.upstream_top_box.setAccessibleName("Alternatives asked of the upstream")
        self.upstream_top_box.setToolTip(UPSTREAM_TOP_HINT)

    def settings(self) -> ServeSettings:
        top = self.upstream_top_box.value()
        return ServeSettings(self.host_edit.text().strip(), self.port_box.value(), self.key_edit.text(),
                             self.upstream_edit.text().strip(), None if top == CLIENTS_OWN else top)

    def start(self) -> asyncio.Task | None:
        settings = self.settings()
        problem = settings.problem()
        if problem:  # said here, in the dialog, before anything starts
            self.message.setText(f"Not started: {problem}.")
            return None
        return self._spawn(self._start(settings))

    async def _start(self, settings: ServeSettings) -> None:
        try:
            await self._controller.start(settings)
        except ServeError as e:
            self.message.setText(f"Not started: {e}.")

    def stop(self) -> asyncio.Task:
        return self._spawn(self._controller.stop("stopped from the Serve dialog"))

    def _update_key_hint(self) -> None:
        needed = not is_loopback(self.host_edit.text() or "127.0.0.1")
        self.key_hint.setText(("Required here. " if needed else "") + KEY_HINT)
        self.key_hint.setStyleSheet("color: #c0392b" if needed else "")

    def _on_state(self, state: ServeState) -> None:
        editing = not state.running and not state.starting
        for w in (self.host_edit, self.port_box, self.key_edit, self.upstream_edit):
            w.setEnabled(editing)
        self.upstream_top_box.setEnabled(editing and bool(self.upstream_edit.text().strip()))
        self.start_button.setEnabled(editing)
        self.stop_button.setEnabled(state.running)
        self.url_row.setVisible(state.running)
        self.url_edit.setText(state.url)
        if state.running:
            self.message.setText(f"Serving {state.what} at the address above (an OpenAI client's base_url).")
        elif state.starting:
            self.message.setText("Starting…")
        elif state.message:
            self.message.setText(f"Not serving: {state.message}.")
        else:
            self.message.setText("Not serving.")
