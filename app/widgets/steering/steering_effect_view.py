"""The inspector's Steering tab: the selected token's distribution with and without the answer's steering.

Nothing is computed until "Without steering" is pressed; from then on, each
token selected in a steered answer is computed on the model's worker
(`SteeringJobs.effect`, engine.steering.steering_effect: one extra forward of
that position without the steering, on a context of its own), and a newer
selection drops an older result. It shows KL(steered ‖ unsteered), the chosen
token's probability and rank both ways, and the tokens that rose and fell
most. An answer written without steering, or one whose vector is no longer
available, is said so in words.
"""

from __future__ import annotations

import asyncio
import html
import logging
import math

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from engine import steering as steer

from app.controllers.engine_host import describe_error
from app.state.conversation import Conversation, Message
from app.controllers.steering_jobs import EffectView, SteeringJobs
from app.widgets.fmt import pct, visible

log = logging.getLogger(__name__)

SETTLE_MS = 150  # stepping through tokens asks for the last one only
COLUMNS = ("Token", "Steered", "Without", "Δ log p")
NOT_STEERED = "This answer was written without steering."
NOTHING = "Select a token of a steered answer to see what the steering did to it."
READY = "Press “Without steering” to run this position again without the steering and compare."


class SteeringEffectView(QWidget):
    """Draws `EffectView`s; `show_token` is called by the inspector on every selection."""

    def __init__(self, jobs: SteeringJobs, parent: QWidget | None = None):
        super().__init__(parent)
        self._jobs = jobs
        self._conv: Conversation | None = None
        self._message: Message | None = None
        self._index: int | None = None
        self._wanted = False  # "Without steering" was pressed: compute for each selected token
        self._generation = 0
        self._task: asyncio.Task | None = None
        self.view: EffectView | None = None  # the result on screen (tests read it)
        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.setInterval(SETTLE_MS)
        self._settle.timeout.connect(self._start)
        self.setAccessibleName("What steering did")

        self.status = QLabel(NOTHING)
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.RichText)
        self.status.setAccessibleName("Steering effect status")
        self.button = QPushButton("Without steering")
        self.button.setAccessibleName("Compare with the distribution without steering")
        self.button.setToolTip("Run this position again without the answer's steering (one forward) and compare")
        self.button.clicked.connect(self.compare)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setAccessibleName("Steering effect on the chosen token")
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setAccessibleName("Tokens steering raised and lowered most")
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in range(1, len(COLUMNS)):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        row = QHBoxLayout()
        row.addWidget(self.button)
        row.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(self.status)
        lay.addLayout(row)
        lay.addWidget(self.summary)
        lay.addWidget(self.table, 1)
        self._show_nothing(NOTHING)

    # -- what is selected ------------------------------------------------------------------

    def show_token(self, conv: Conversation | None, message: Message | None, index: int | None) -> None:
        self._conv, self._message, self._index = conv, message, index
        self._generation += 1  # whatever is on its way is for another token now
        if message is None or index is None or not message.is_assistant:
            self._show_nothing(NOTHING)
            return
        record = (message.request or {}).get("steering")
        if not record:
            self._show_nothing(NOT_STEERED)
            return
        try:
            steering = self._jobs.answer_steering(message)
        except steer.SteeringError as e:
            self._show_nothing(f"Cannot compare: {html.escape(describe_error(e))}")
            return
        described = steering.describe() if steering is not None else "no steering"
        self.status.setText(f"Steered by <b>{html.escape(described)}</b>.")
        self.button.setEnabled(steering is not None and not message.generating)
        if self.view is not None and (self.view.message_id, self.view.index) == (message.id, index):
            return
        self._clear_result(READY if not self._wanted else "Computing…")
        if self._wanted and steering is not None and not message.generating:
            self._settle.start()

    def compare(self) -> None:
        """Compute for the selected token now (and for each token selected after)."""
        self._wanted = True
        self._generation += 1
        self._start()

    def _start(self) -> None:
        conv, message, index = self._conv, self._message, self._index
        if conv is None or message is None or index is None:
            return
        generation = self._generation
        self.summary.setText("Computing…")
        self._task = asyncio.ensure_future(self._compute(generation, conv, message, index))

    async def _compute(self, generation: int, conv: Conversation, message: Message, index: int) -> None:
        self.button.setEnabled(False)
        try:
            view = await self._jobs.effect(conv, message, index)
        except Exception as e:  # noqa: BLE001 - said in the view; the chat goes on
            if generation == self._generation:
                self._clear_result(f"Not computed: {html.escape(describe_error(e))}")
            return
        finally:
            if generation == self._generation:
                self.button.setEnabled(True)
        if generation == self._generation:
            self._draw(view)

    # -- drawing ---------------------------------------------------------------------------

    def _show_nothing(self, text: str) -> None:
        self.status.setText(text)
        self.button.setEnabled(False)
        self._clear_result("")

    def _clear_result(self, text: str) -> None:
        self.view = None
        self.summary.setText(text)
        self.table.setRowCount(0)

    def _draw(self, view: EffectView) -> None:
        self.view = view
        e = view.effect
        token = html.escape(visible(view.texts.get(e.token_id, "")))
        self.summary.setText(
            f"KL(steered ‖ without) <b>{e.kl:.3f}</b> nats<br>"
            f"<code>{token}</code>: <b>{html.escape(pct(e.steered_prob))}</b> (rank {e.steered_rank + 1}) steered, "
            f"<b>{html.escape(pct(e.unsteered_prob))}</b> (rank {e.unsteered_rank + 1}) without"
        )
        rows = [("↑", s) for s in e.risers] + [("↓", s) for s in e.fallers]
        self.table.setRowCount(len(rows))
        up, down = QBrush(QColor("#2e8b57")), QBrush(QColor("#c0392b"))
        for r, (arrow, shift) in enumerate(rows):
            cells = (
                f"{arrow} {visible(view.texts.get(shift.token_id, ''))}",
                pct(math.exp(shift.steered_logprob)),
                pct(math.exp(shift.unsteered_logprob)),
                f"{shift.delta:+.2f}",
            )
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c == 3:
                    item.setForeground(up if shift.delta > 0 else down)
                if c:
                    item.setTextAlignment(int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter))
                self.table.setItem(r, c, item)
