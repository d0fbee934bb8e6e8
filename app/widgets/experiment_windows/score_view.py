"""Score text: how surprising any text is to the loaded model, token by token.

Paste text, open a file or pick one of the conversation's user messages; the
model reads it teacher-forced (engine.experiments.score) and every token is
coloured by its surprisal. The summary gives the perplexity; clicking a token
shows the model's alternatives at that position and the rank of the actual token.
The run itself belongs to the `ExperimentController` (a `ScoreRun`); this
window draws its result.
"""

from __future__ import annotations

import asyncio
import html
from pathlib import Path

from engine import experiments
from PySide6.QtCore import Qt
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.controllers.engine_host import EngineHost
from app.controllers.experiment import ExperimentController, ScoreRun
from app.state.conversation import Conversation
from app.theme import is_dark
from app.widgets.heat import HeatLegend
from app.widgets.chat.message_body import MessageBody
from app.widgets.experiment_windows.one_run import OneRun
from app.widgets.inspection.token_detail import TokenDetail
from app.widgets.escape_closes import close_on_escape
from app.window_geometry import fit_to_screen

MAX_FILE_BYTES = 2 << 20  # a text longer than this would take minutes to score token by token anyway


class ScoreView(QWidget):
    def __init__(self, host: EngineHost, conv: Conversation | None = None, parent: QWidget | None = None, *,
                 controller: ExperimentController | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.setWindowTitle("Score text")
        close_on_escape(self)
        self.setAccessibleName("Score text")
        self._experiments = controller or ExperimentController(host)
        self.result: experiments.ScoreResult | None = None

        self.text = QPlainTextEdit()
        self.text.setAccessibleName("Text to score")
        self.text.setPlaceholderText("Paste any text: how surprising is each token to the model?")
        self.text.setMaximumHeight(180)
        self.open_button = QPushButton("Open file…")
        self.open_button.clicked.connect(lambda: self.open_file())
        self.messages = QComboBox()
        self.messages.setAccessibleName("User messages")
        self.messages.addItem("From the chat…", None)
        for m in (conv.path() if conv else []):
            if m.role == "user":  # as the model read it: a question's attached files' blocks before its text
                files = f" (+ {len(m.attachments)} attached)" if m.attachments else ""
                self.messages.addItem(" ".join(m.content.split())[:60] + files, m.model_text())
        self.messages.setEnabled(self.messages.count() > 1)
        self.messages.activated.connect(self._on_message_picked)
        self.score_button = QPushButton("Score")
        self.score_button.setDefault(True)
        self.score_button.clicked.connect(lambda: self.run())
        self.stop_button = QPushButton("Stop")
        bar = QHBoxLayout()
        for w in (self.open_button, self.messages, self.score_button, self.stop_button):
            bar.addWidget(w)
        bar.addStretch(1)
        bar.addWidget(HeatLegend("surprisal"))

        self.summary = QLabel("Each token is read given everything before it (one model step per token).")
        self.summary.setTextFormat(Qt.TextFormat.RichText)  # our markup; the text and every error are escaped
        self.summary.setWordWrap(True)
        self.summary.setAccessibleName("Score summary")
        self._runs: OneRun[ScoreRun] = OneRun(self.score_button, self.stop_button, self.summary, busy="Scoring…",
                                              failed="Scoring failed", on_end=self._show_run)
        self.body = MessageBody(self)
        self.body.setAccessibleName("Scored tokens")
        self.body.token_clicked.connect(self.select)
        self.detail = TokenDetail()
        self.detail.setTabVisible(1, False)  # no sampler ran: no stages
        self.detail.table.setColumnHidden(2, True)  # nor a sampler distribution

        lay = QVBoxLayout(self)
        lay.addWidget(self.text, 1)
        lay.addLayout(bar)
        lay.addWidget(self.summary)
        lay.addWidget(self.body, 2)
        lay.addWidget(self.detail, 2)
        fit_to_screen(self, 900, 760)  # no larger than the screen (a 1024x700 one)

    def _on_message_picked(self, index: int) -> None:
        content = self.messages.itemData(index)
        if content:
            self.text.setPlainText(content)

    def open_file(self, path: str | Path | None = None) -> bool:
        if path is None:
            chosen, _ = QFileDialog.getOpenFileName(self, "Open a text file to score")
            if not chosen:
                return False
            path = chosen
        p = Path(path)
        try:
            if p.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"{p.name} is larger than {MAX_FILE_BYTES >> 20} MiB")
            self.text.setPlainText(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            text = f"{p.name} is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else str(e)
            self.summary.setText(html.escape(f"Could not open the file: {text}"))
            return False
        return True

    def run(self) -> asyncio.Task | None:
        """Start scoring the text; the task ends with it (None when there is nothing to score)."""
        return self._runs.start(lambda: self._experiments.score(self.text.toPlainText()))

    def stop(self) -> None:
        self._runs.stop()

    def _show_run(self, run: ScoreRun) -> None:
        if run.result is not None:
            self.show_result(run.result, run.context_text)

    def show_result(self, result: experiments.ScoreResult, context_text: str = "") -> None:
        """Draw `result`; `context_text` is its start that only serves as context (nothing predicts it)."""
        self.result = result
        self.body.show_tokens(result.events(), "surprisal", is_dark(self.palette()))
        partial = " (stopped early)" if len(result.tokens) < len(result.token_ids) - result.context else ""
        context = f" The start, “{html.escape(context_text)}”, is context: nothing predicts it." if context_text.strip() else ""
        self.summary.setText(
            f"{len(result.tokens)} tokens scored{partial} · perplexity <b>{result.perplexity:.2f}</b> · "
            f"mean surprisal {result.mean_surprisal_bits:.2f} bits/token · total {-result.total_logprob:.1f} nats. "
            f"Click a token for the model's alternatives there.{context}"
        )

    def select(self, index: int) -> None:
        if self.result is None or not 0 <= index < len(self.result.tokens):
            return
        self.body.set_selected(index)
        ev = self.result.tokens[index].as_event(index)
        self.detail.show_token(ev, f"token {index + 1}:")

    def closeEvent(self, event: QCloseEvent) -> None:
        self._runs.close()  # the run ends after this window: nothing to draw into
        super().closeEvent(event)
