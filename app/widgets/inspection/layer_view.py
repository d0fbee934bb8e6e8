"""The inspector's Layers tab: how the model got to the selected token, layer by layer, and where it looked.

Nothing is computed until the tab is open: then the selected token's layer
view (engine.capabilities.LayerLens: each layer's top tokens through the
model's own final norm and head, the chosen token's probability and rank,
attention) runs on the model's worker (app/controllers/lens_jobs.py), and after it the
heatmap of the answer's nearby tokens. A newer selection makes an older
result stale: it is dropped when it arrives. A model without the capability
(a server) is said so in words.
"""

from __future__ import annotations

import asyncio
import html
import logging
import math

import numpy as np
from engine import ModelInfo
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QHeaderView, QLabel, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from app.controllers import lens_jobs
from app.controllers.engine_host import EngineHost, describe_error
from app.state.conversation import Conversation, Message
from app.widgets.inspection import passage_jobs
from app.widgets.inspection.attention_view import AttentionView
from app.widgets.fmt import pct, visible
from app.widgets.inspection.layer_heatmap import LayerHeatmap
from app.widgets.inspection.passage_panel import PassagePanel
from app.widgets.side_scroll import downward_scroll
from app.widgets.subscriptions import follow

log = logging.getLogger(__name__)

SETTLE_MS = 150  # stepping through tokens with Alt+arrows asks for the last one only
WAIT_FOR_ANSWER_MS = 500  # the selected answer is still being written: look again this much later
COLUMNS = ("Layer", "p(token)", "Rank", "Top tokens")
EMPTY_TEXT = "Select a token of an answer to see what each layer predicted there."


class LayerView(QWidget):
    index_clicked = Signal(int)  # an answer token index picked in the heatmap

    def __init__(self, host: EngineHost, parent: QWidget | None = None):
        super().__init__(parent)
        self._host = host
        self._conv: Conversation | None = None
        self._message: Message | None = None
        self._index: int | None = None
        self._shown: tuple[int, int] | None = None  # (message id, index) on screen or on its way
        self._generation = 0  # bumped per request: an older result arriving later is dropped
        self._task: asyncio.Task | None = None
        self.view: lens_jobs.LensView | None = None  # the result on screen (tests read it)
        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.setInterval(SETTLE_MS)
        self._settle.timeout.connect(self._start)
        follow(self, ((host.model_changed, self._on_model_changed),))  # the host outlives this window

        self.status = QLabel(EMPTY_TEXT)
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.RichText)
        self.status.setAccessibleName("Layer view status")
        self.heatmap = LayerHeatmap()
        self.heatmap.index_clicked.connect(self.index_clicked)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setAccessibleName("Top tokens per layer")
        header = self.table.horizontalHeader()
        for col in range(len(COLUMNS) - 1):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.attention = AttentionView()
        self.passages = PassagePanel()  # where the token looked in the attached documents (issue 48)
        self.passages.whole_answer_requested.connect(self._start_whole_answer)
        self._whole_answer_of: int | None = None  # the answer (message id) whose whole-answer bar is shown
        self._whole_task: asyncio.Future[None] | None = None
        top = QWidget()
        top_lay = QVBoxLayout(top)
        top_lay.setContentsMargins(0, 0, 0, 0)
        top_lay.addWidget(self.heatmap)
        top_lay.addWidget(self.table, 1)
        # Below their size hints (82 and 118 px), so that with the Layers tab open the window still fits a
        # 700-pixel screen (it was 727 tall there); the splitter gives them their room back when there is some.
        top.setMinimumHeight(60)
        self.attention.setMinimumHeight(80)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(self.attention)
        # In a scroll area: the whole answer's bar (a row per passage) must not make the window taller than a
        # small screen (at 1024x700 it grew to 851 pixels).
        split.addWidget(downward_scroll(self.passages, "passage_scroll", "Where it looked"))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(self.status)
        lay.addWidget(split, 1)

    # -- what to show -------------------------------------------------------------------

    def show_token(self, conv: Conversation | None, message: Message | None, index: int | None) -> None:
        """The token to look at (an answer's token `index`); computed when the view is open."""
        if conv is not self._conv or message is None or index is None:
            self._clear()  # another chat, or no token: what is on screen belongs to something no longer selected
        self._conv, self._message, self._index = conv, message, index
        if self.heatmap.indices and message is not None and self._shown and self._shown[0] == message.id:
            self.heatmap.set_selected(index)
        if self.isVisible():
            self._settle.start(SETTLE_MS)

    def _clear(self) -> None:
        """Nothing on screen: no table, heatmap or attention, and a late result of the last request is dropped."""
        self._settle.stop()
        self._generation += 1
        self._shown = None
        self.view = None
        self.table.setRowCount(0)
        self.heatmap.clear()
        self.attention.set_attention(None, (), 0)
        self.passages.set_view(None)
        self._forget_whole_answer()
        self.status.setText(EMPTY_TEXT)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._settle.start(SETTLE_MS)

    def _on_model_changed(self, _info: ModelInfo) -> None:
        self._shown = None  # what is on screen was another model's view
        if self.isVisible():
            self._settle.start(SETTLE_MS)

    def _wanted(self) -> tuple[int, int] | None:
        m, i = self._message, self._index
        if m is None or i is None or self._conv is None or not m.is_assistant or m.generating:
            return None
        return m.id, i

    def _start(self) -> None:
        wanted, conv, message = self._wanted(), self._conv, self._message
        if wanted is None or conv is None or message is None:  # _wanted() is None whenever either is
            if self._message is not None and self._message.generating and self.isVisible():
                self.status.setText("The layer view opens when the answer is finished.")
                self._settle.start(WAIT_FOR_ANSWER_MS)  # look again: nothing tells this view the answer ended
            return
        if wanted == self._shown:
            return
        self._shown = wanted
        self._generation += 1
        if self._task is not None and not self._task.done():
            self._task.cancel()  # its worker call still finishes; its result is dropped
        self._task = asyncio.ensure_future(self._compute(self._generation, conv, message, wanted[1]))

    async def _compute(self, generation: int, conv: Conversation, message: Message, index: int) -> None:
        self.status.setText(f"Reading the layers at token {index + 1}…")
        try:
            view = await lens_jobs.layer_view(self._host, conv, message, index)
            if generation != self._generation:
                return
            self._show(view, message)
            passages = await passage_jobs.passage_view(self._host, conv, message, view)
            if generation != self._generation:
                return
            self.passages.set_view(passages)
            if self._whole_answer_of != message.id:
                self._forget_whole_answer()  # the bar was another answer's
            tokens = conv.tokens(message)
            columns = lens_jobs.heatmap_columns(len(tokens), index)
            probs = np.full((view.capture.n_layers, len(columns)), np.nan, dtype=np.float32)  # NaN: not yet read
            texts = tuple(visible(tokens[i].token_text) for i in columns)
            for chunk in lens_jobs.nearest_first(columns, index):
                heat = await lens_jobs.heatmap(self._host, conv, message, chunk)
                if generation != self._generation:
                    return
                for j, i in enumerate(heat.indices):
                    probs[:, columns.index(i)] = heat.probs[:, j]
                self.heatmap.set_data(probs, columns, texts)
                self.heatmap.set_selected(self._index if self._message is message else None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - shown to the user in words, the window goes on
            if generation == self._generation:
                log.info("layer view failed: %s", e, exc_info=not isinstance(e, (ValueError, RuntimeError)))
                self._shown = None
                self.view = None
                self.table.setRowCount(0)
                self.heatmap.clear()
                self.attention.set_attention(None, (), 0)
                self.passages.set_view(None)
                self.status.setText(html.escape(describe_error(e)))

    def _forget_whole_answer(self) -> None:
        self._whole_answer_of = None
        self.passages.set_answer(None)

    def _start_whole_answer(self) -> None:
        conv, message = self._conv, self._message
        if conv is None or message is None or self._wanted() is None:
            self.passages.set_answer(None)
            return
        self._whole_answer_of = message.id
        self._whole_task = asyncio.ensure_future(self._whole_answer(conv, message))  # held: the loop keeps weak refs

    async def _whole_answer(self, conv: Conversation, message: Message) -> None:
        """The per-passage bar of the whole answer (issue 48): on the model's worker, shown unless the view moved
        to another chat or answer meanwhile (another token of the same answer keeps it)."""
        try:
            answer = await passage_jobs.answer_attention(self._host, conv, message)
        except Exception as e:  # noqa: BLE001 - said in the panel, the window goes on
            log.info("whole-answer attention failed: %s", e, exc_info=not isinstance(e, (ValueError, RuntimeError)))
            answer, note = None, f"Not read: {describe_error(e)}"
        else:
            note = "" if answer is not None else "No attached file in this answer's prompt."
        if self._conv is conv and self._whole_answer_of == message.id:
            self.passages.set_answer(answer, note)

    # -- drawing ------------------------------------------------------------------------

    def _show(self, view: lens_jobs.LensView, message: Message) -> None:
        self.view = view
        cap = view.capture
        target = visible(view.top_texts.get(cap.target_id, str(cap.target_id)))
        first = cap.first_top1_layer
        where = f"first top-1 at layer <b>{first}</b> of {cap.n_layers}" if first is not None else \
            f"top-1 at none of the {cap.n_layers} layers"
        other = ""
        if message.model and message.model.get("name") not in (None, view.model_name):
            other = f"<br><i>Computed with {html.escape(view.model_name)}; this answer was written by " \
                    f"{html.escape(str(message.model.get('name')))}.</i>"
        self.status.setText(f"Token {view.index + 1} <code>{html.escape(target)}</code>: {where}{other}")
        self.table.setRowCount(cap.n_layers)
        for row, layer in enumerate(reversed(cap.layers)):  # the last layer first: the answer the model gave
            number = cap.n_layers - 1 - row
            tops = "  ".join(f"{visible(view.top_texts.get(t, '?'))} {pct(math.exp(lp))}"
                             for t, lp in layer.top)
            cells = (str(number), pct(layer.target_prob), str(layer.target_rank + 1), tops)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col < 3:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(row, col, item)
        self.attention.set_attention(cap.attention, view.token_texts, view.answer_start)
