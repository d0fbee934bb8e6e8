"""Model ▸ Connect to server…: an OpenAI-compatible server's URL, its model (from its own list), key and timeout.

The model list is fetched on a worker thread (`list_server_models` blocks on the
network) and handed back to the event loop (`app.controllers.off_thread.run_off_thread`), so the
window never waits on a server; a stale answer (the URL changed meanwhile) is
dropped. A failure shows the engine's one-line message under the fields.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from engine import EngineError, list_server_models, split_server_spec
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers.engine_host import describe_error
from app.controllers.off_thread import run_off_thread
from app.state.models.servers import DEFAULT_TIMEOUT_S, ApiKeys, recent_servers, split_server_credentials
from app.state.database.store import Store

log = logging.getLogger(__name__)

COMBO_CHARS = 24  # the server and model boxes ask for this much text; longer entries scroll inside them
CONNECT_TIMEOUT_S = 5.0  # for the model list: a dead host answers "refused" at once, an unroutable one within this


@dataclass(frozen=True)
class ConnectChoice:
    url: str  # base URL, ending in /v1
    model: str
    api_key: str | None
    timeout_s: float
    remember_key: bool
    server_sampling: bool
    credentials: str | None = None  # "user:password" typed into the URL: kept with the key, never in `url`

    @property
    def spec(self) -> str:
        return f"{self.url}#{self.model}"

class ConnectDialog(QDialog):
    """`exec()` (or `open()`), then read `choice()`. `refresh()` lists the server's models in the background."""

    def __init__(self, store: Store, keys: ApiKeys, server_sampling: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Connect to server")
        self.setMinimumWidth(560)
        self._keys = keys
        self._recent = recent_servers(store)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="logitlab-models")
        self._asked = 0  # numbers the listings: only the latest one may fill the model box
        self.listing: asyncio.Task | None = None
        self._listed = ""  # the URL text of the latest listing

        self._make_server_boxes()
        self._make_key_fields(keys)
        self._make_options(server_sampling)
        self._lay_out()
        url_edit = self.url_box.lineEdit()
        if url_edit is not None:
            url_edit.editingFinished.connect(self._on_url_edited)
        self.url_box.activated.connect(lambda _i: self._on_url_edited())
        self.model_box.currentTextChanged.connect(lambda _t: self._update_connect_button())
        self.finished.connect(lambda _result: self._pool.shutdown(wait=False))
        if self._recent:
            self._fill_from_recent(self._recent[0]["url"])

    def _make_server_boxes(self) -> None:
        """The server's URL (recent ones listed) and its model."""
        self.url_box = QComboBox()
        self.model_box = QComboBox()
        self.model_box.setAccessibleName("Model on the server")
        self.url_box.setEditable(True)
        self.url_box.setAccessibleName("Server URL")
        url_edit = self.url_box.lineEdit()
        if url_edit is not None:  # it has one: made editable just above
            url_edit.setPlaceholderText("http://127.0.0.1:8000/v1")
        self.url_box.addItems([r["url"] for r in self._recent])
        # A long URL or model name scrolls inside its box rather than widening the dialog past the screen.
        for box in (self.url_box, self.model_box):
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(COMBO_CHARS)

    def _make_key_fields(self, keys: ApiKeys) -> None:
        """The API key and whether the keyring keeps it (only where a keyring is installed)."""
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setAccessibleName("API key")
        self.key_edit.setPlaceholderText("none (or $LOGITLAB_API_KEY)")
        self.remember_key = QCheckBox("Remember the key in the system keyring")
        self.remember_key.setAccessibleName("Remember the API key")
        if keys.persistent:
            self.remember_key.setChecked(True)
        else:
            self.remember_key.setEnabled(False)
            self.remember_key.setToolTip("The keyring package is not installed: the key is kept until the app closes")

    def _make_options(self, server_sampling: bool) -> None:
        """The timeout, the List models button, who samples, and the status line."""
        self.timeout = QDoubleSpinBox()
        self.timeout.setAccessibleName("Timeout in seconds")
        self.timeout.setRange(1.0, 3600.0)
        self.timeout.setDecimals(0)
        self.timeout.setSuffix(" s")
        self.timeout.setValue(DEFAULT_TIMEOUT_S)
        self.timeout.setToolTip("How long to wait for an answer, or between two streamed tokens")
        self.refresh_button = QPushButton("List models")
        self.refresh_button.setAccessibleName("List the server's models")
        self.refresh_button.clicked.connect(lambda: self.refresh())
        self.we_sample = QRadioButton("We sample: every stage view, seeds and branching (one request per token)")
        self.server_samples = QRadioButton("The server samples: fast streaming; alternatives and heatmap only")
        (self.server_samples if server_sampling else self.we_sample).setChecked(True)
        self.message = QLabel()
        self.message.setTextFormat(Qt.TextFormat.PlainText)  # a server's own error text
        self.message.setWordWrap(True)
        self.message.setAccessibleName("Connection status")

    def _lay_out(self) -> None:
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_box, 1)
        model_row.addWidget(self.refresh_button)
        form = QFormLayout()
        form.addRow("Server", self.url_box)
        form.addRow("API key", self.key_edit)
        form.addRow("", self.remember_key)
        form.addRow("Timeout", self.timeout)
        form.addRow("Model", model_row)
        sampling = QVBoxLayout()
        sampling.addWidget(self.we_sample)
        sampling.addWidget(self.server_samples)
        form.addRow("Sampling", sampling)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.connect_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.connect_button.setText("Connect")
        self.connect_button.setEnabled(False)  # until the server has listed a model
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.message)
        lay.addWidget(self.buttons)

    # -- reading the fields -------------------------------------------------------------------

    def url_text(self) -> str:
        return self.url_box.currentText().strip()

    def choice(self) -> ConnectChoice:
        base, _ = split_server_spec(self.url_text())
        return ConnectChoice(
            url=base, model=self.model_box.currentText(), api_key=self.key_edit.text().strip() or None,
            timeout_s=float(self.timeout.value()), remember_key=self.remember_key.isChecked(),
            server_sampling=self.server_samples.isChecked(), credentials=split_server_credentials(self.url_text())[1],
        )

    # -- listing the models ---------------------------------------------------------------------

    def refresh(self) -> asyncio.Task | None:
        """Ask the server for its models on a worker thread; the task ends when the box is filled (or not)."""
        text = self.url_text()
        try:
            base, wanted = split_server_spec(text)
        except ValueError as e:
            self._show(str(e), error=True)
            return None
        self._asked += 1
        asked = self._asked
        self._listed = text
        self.model_box.clear()
        self._update_connect_button()
        self._show(f"Asking {base} for its models…")
        call = partial(  # with the URL as typed: credentials in it are sent (as Basic auth), never shown
            list_server_models, text, api_key=self.key_edit.text().strip() or None,
            timeout_s=float(self.timeout.value()), connect_timeout_s=min(CONNECT_TIMEOUT_S, float(self.timeout.value())),
        )
        self.listing = asyncio.ensure_future(self._list(run_off_thread(lambda _state: call(), executor=self._pool),
                                                        asked, wanted))
        return self.listing

    async def _list(self, pending: Awaitable[list[str]], asked: int, wanted: str) -> None:
        try:
            models = await pending
        except Exception as e:  # noqa: BLE001 - every failure is shown; nothing is connected yet
            if asked == self._asked:
                self._show(describe_error(e), error=True)
            if not isinstance(e, EngineError):
                log.warning("listing the models failed", exc_info=e)
            return
        if asked != self._asked:
            return  # the URL changed while this server answered
        self.model_box.addItems(models)
        recent = next((r for r in self._recent if r["url"] == split_server_spec(self.url_text())[0]), None)
        for name in (wanted, recent["model"] if recent else ""):
            if name and self.model_box.findText(name) >= 0:
                self.model_box.setCurrentText(name)
                break
        if models:
            self._show(f"{len(models)} model{'s' if len(models) != 1 else ''} on this server.")
        else:
            self._show("The server lists no model.", error=True)
        self._update_connect_button()

    # -- reactions ------------------------------------------------------------------------------

    def _on_url_edited(self) -> None:
        text = self.url_text()
        if not text or (text == self._listed and self.listing is not None):
            return  # focus left the field without a change: the list stands
        self._fill_from_recent(text)

    def _fill_from_recent(self, text: str) -> None:
        """The saved timeout and key of a known server; then list its models."""
        self.url_box.setCurrentText(text)
        try:
            base, _ = split_server_spec(text)
        except ValueError as e:
            self._show(str(e), error=True)
            return
        recent = next((r for r in self._recent if r["url"] == base), None)
        if recent is not None:
            self.timeout.setValue(float(recent.get("timeout_s", DEFAULT_TIMEOUT_S)))
        key = self._keys.get(base)
        if key:
            self.key_edit.setText(key)
        self.refresh()

    def _update_connect_button(self) -> None:
        self.connect_button.setEnabled(bool(self.model_box.currentText()))

    def _show(self, text: str, error: bool = False) -> None:
        self.message.setText(text)
        self.message.setStyleSheet("color: #d9534f" if error else "")
