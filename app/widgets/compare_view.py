"""Chat ▸ Compare settings…: one prompt, 2–4 columns of sampler settings, the same seed, aligned tokens.

Columns generate one after another on the loaded model; the engine finds the
shared prompt in its KV cache, so only the first column computes it. With the
same seed every column takes the same random draw at each step, so the
columns agree until the settings change the survivors somewhere: that first
divergence is marked (wavy underline) in every column. Each column shows its
tokens coloured by probability (hover for alternatives, click to inspect
below), its stats, and can be taken into the chat as a new answer.
"""

from __future__ import annotations

import asyncio
import html
import logging
import secrets

from engine import GenerationRequest, GenerationStats, SamplerSettings, TokenEvent
from engine import experiments
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QGridLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.engine_host import EngineHost, describe_error
from app.experiments import TOP_N, add_answer, model_dict
from app.state.conversation import Conversation, Message
from app.state.library import Library
from app.state.settings import SettingsState
from app.theme import is_dark
from app.token_stream import TokenStream
from app.widgets.fmt import bits, pct, visible
from app.widgets.message_body import MessageBody
from app.widgets.prob_table import ProbTable
from app.widgets.stage_view import StageView

log = logging.getLogger(__name__)

MIN_COLUMNS, MAX_COLUMNS = 2, 4
DIVERGENCE_COLOR = QColor(200, 30, 160)

# (field, label, kind, minimum, maximum, step): the knobs a column edits; the rest come from the chat's settings.
EDITED_FIELDS: tuple[tuple[str, str, type, float, float, float], ...] = (
    ("temperature", "Temperature", float, 0.0, 5.0, 0.05),
    ("top_k", "Top-k", int, 0, 100000, 1),
    ("top_p", "Top-p", float, 0.01, 1.0, 0.01),
    ("min_p", "Min-p", float, 0.0, 1.0, 0.01),
    ("typical_p", "Typical-p", float, 0.01, 1.0, 0.01),
    ("repetition_penalty", "Repetition penalty", float, 0.05, 3.0, 0.01),
    ("xtc_probability", "XTC probability", float, 0.0, 1.0, 0.05),
)


class SettingsEditor(QWidget):
    """Spin boxes for the common sampler knobs over a base `SamplerSettings`."""

    changed = Signal()

    def __init__(self, settings: SamplerSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self._base = settings
        self.boxes: dict[str, QSpinBox | QDoubleSpinBox] = {}
        grid = QGridLayout(self)  # two label/box pairs per row: the columns stay short
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setVerticalSpacing(2)
        for i, (name, label, kind, lo, hi, step) in enumerate(EDITED_FIELDS):
            box: QSpinBox | QDoubleSpinBox
            if kind is int:
                box = QSpinBox()
                box.setRange(int(lo), int(hi))
            else:
                box = QDoubleSpinBox()
                box.setDecimals(2)
                box.setRange(lo, hi)
                box.setSingleStep(step)
            box.setValue(getattr(settings, name))
            box.setAccessibleName(label)
            box.valueChanged.connect(lambda _v: self.changed.emit())
            self.boxes[name] = box
            row, col = divmod(i, 2)
            grid.addWidget(QLabel(label), row, 2 * col)
            grid.addWidget(box, row, 2 * col + 1)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)

    def settings(self) -> SamplerSettings:
        """The edited settings (raises ValueError, in words, when they are invalid)."""
        values = {name: (int(b.value()) if isinstance(b, QSpinBox) else round(b.value(), 4)) for name, b in self.boxes.items()}
        return self._base.with_(**values)

    def set_value(self, name: str, value: float) -> None:
        self.boxes[name].setValue(value)


def mark_tokens(body: MessageBody, indices: list[int] | tuple[int, ...], color: QColor = DIVERGENCE_COLOR) -> None:
    """Underline tokens with a wavy line and bold them (a divergence or a changed position)."""
    fmt = QTextCharFormat()
    fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
    fmt.setUnderlineColor(color)
    fmt.setFontWeight(700)
    for i in indices:
        if 0 <= i < body.rendered_tokens:
            start, end = body.token_span(i)
            cursor = QTextCursor(body.document())
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)


def stats_text(s: experiments.ColumnStats) -> str:
    return (
        f"{s.length} tokens · {s.finish_reason} · {s.mean_surprisal_bits:.2f} bits/token · "
        f"entropy {s.mean_entropy:.2f} nats · distinct-2 {s.distinct_2:.2f} · "
        f"repeated 3-grams {s.repeated_ngrams} · {s.tokens_per_s:.1f} tok/s"
    )


class TokenColumn(QFrame):
    """One run: optional settings editor, coloured tokens, stats, and its actions."""

    token_clicked = Signal(object, int)  # TokenColumn, index
    duplicate_requested = Signal(object)
    remove_requested = Signal(object)
    take_requested = Signal(object)

    def __init__(self, title: str, settings: SamplerSettings | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName(title)
        self.events: list[TokenEvent] = []
        self.stats: GenerationStats | None = None
        self.run_settings: SamplerSettings | None = None  # as last run (seed filled in)
        lay = QVBoxLayout(self)
        head = QHBoxLayout()
        self.title = QLabel(f"<b>{html.escape(title)}</b>")
        head.addWidget(self.title, 1)
        self.duplicate_button = QPushButton("Duplicate")
        self.duplicate_button.setToolTip("Add a column with these settings, to change one value in it")
        self.remove_button = QPushButton("Remove")
        self.take_button = QPushButton("Take into chat")
        self.take_button.setToolTip("Add this answer to the conversation as a new branch")
        self.take_button.setEnabled(False)
        self.duplicate_button.clicked.connect(lambda: self.duplicate_requested.emit(self))
        self.remove_button.clicked.connect(lambda: self.remove_requested.emit(self))
        self.take_button.clicked.connect(lambda: self.take_requested.emit(self))
        for b in (self.duplicate_button, self.remove_button, self.take_button):
            head.addWidget(b)
        lay.addLayout(head)
        self.editor = SettingsEditor(settings) if settings is not None else None
        if self.editor is not None:
            lay.addWidget(self.editor)
        else:
            self.duplicate_button.hide()
            self.remove_button.hide()
        self.body = MessageBody(self)
        self.body.setAccessibleName(f"{title} tokens")
        self.body.token_clicked.connect(lambda i: self.token_clicked.emit(self, i))
        lay.addWidget(self.body)
        self.stats_label = QLabel()
        self.stats_label.setWordWrap(True)
        self.stats_label.setAccessibleName(f"{title} statistics")
        lay.addWidget(self.stats_label)
        lay.addStretch(1)
        self.clear()

    def clear(self) -> None:
        self.events, self.stats = [], None
        self.body.show_tokens([], "probability", is_dark(self.palette()))
        self.stats_label.setText("")
        self.take_button.setEnabled(False)

    def show_events(self, events: list[TokenEvent]) -> None:
        self.events = list(events)
        self.body.show_tokens(self.events, "probability", is_dark(self.palette()))

    def append(self, events: list[TokenEvent]) -> None:
        self.events.extend(events)
        self.body.append_tokens(events)

    def finish(self, stats: GenerationStats | None) -> experiments.ColumnStats:
        self.stats = stats
        summary = experiments.column_stats(self.events, stats.finish_reason if stats else "cancelled",
                               stats.decode_tokens_per_s if stats else 0.0)
        self.stats_label.setText(stats_text(summary))
        return summary

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]


class TokenDetail(QTabWidget):
    """The clicked token's alternatives and sampler stages (the inspector's views)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.label = QLabel("Click a token to see its alternatives and what each sampler stage did.")
        self.label.setWordWrap(True)
        self.table = ProbTable()
        self.stages = StageView()
        alts = QWidget()
        lay = QVBoxLayout(alts)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label)
        lay.addWidget(self.table, 1)
        self.addTab(alts, "Alternatives")
        self.addTab(self.stages, "Sampler stages")
        self.setAccessibleName("Token details")

    def show_token(self, ev: TokenEvent | None, where: str = "") -> None:
        self.table.show_token(ev)
        self.stages.show_token(ev)
        if ev is not None:
            self.label.setText(
                f"{html.escape(where)} <b><code>{html.escape(visible(ev.token_text))}</code></b> · "
                f"p {html.escape(pct(ev.prob))} · rank {ev.rank + 1} · {bits(ev.logprob)} · entropy {ev.entropy:.2f} nats"
            )


class CompareView(QWidget):
    """A window: the prompt, the columns, and the clicked token's details."""

    def __init__(
        self,
        library: Library,
        settings: SettingsState,
        host: EngineHost,
        anchor: tuple[Conversation, Message] | None = None,
        parent: QWidget | None = None,
    ):
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Compare settings")
        self.setAccessibleName("Compare settings")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self._library = library
        self._settings = settings
        self._host = host
        self._anchor = anchor  # (conversation, user message) the prompt comes from
        self._task: asyncio.Task | None = None
        self._stream: TokenStream | None = None
        self._running = False
        self.columns: list[TokenColumn] = []
        self.divergence: int | None = None
        self.summaries: list[experiments.ColumnStats] = []

        self.prompt = QPlainTextEdit()
        self.prompt.setAccessibleName("Prompt")
        self.prompt.setMaximumHeight(90)
        self.prompt_note = QLabel()
        self.prompt_note.setWordWrap(True)
        if anchor is not None:
            self.prompt.setPlainText(anchor[1].content)
        self.prompt.textChanged.connect(self._update_prompt_note)

        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.add_button = QPushButton("Add column")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(min(settings.options.max_new_tokens, 128))
        self.max_tokens.setAccessibleName("Max new tokens")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        current_seed = settings.options.sampler.seed
        self.seed.setValue(current_seed if current_seed is not None and current_seed < 2**31 else secrets.randbelow(2**31))
        self.seed.setAccessibleName("Seed")
        self.same_seed = QCheckBox("Same seed in every column")
        self.same_seed.setChecked(True)
        self.same_seed.setToolTip("The same random draw at every step, so differences come from the settings alone")
        self.run_button.clicked.connect(lambda: self.run())
        self.stop_button.clicked.connect(self.stop)
        self.add_button.clicked.connect(lambda: self.add_column())
        bar = QHBoxLayout()
        for w in (self.run_button, self.stop_button, self.add_button):
            bar.addWidget(w)
        bar.addSpacing(12)
        bar.addWidget(QLabel("Max tokens"))
        bar.addWidget(self.max_tokens)
        bar.addWidget(QLabel("Seed"))
        bar.addWidget(self.seed)
        bar.addWidget(self.same_seed)
        bar.addStretch(1)
        self.status = QLabel()
        self.status.setAccessibleName("Comparison status")

        self._columns_box = QWidget()
        self._columns_row = QHBoxLayout(self._columns_box)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self._columns_box)
        self.detail = TokenDetail()
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(scroll)
        split.addWidget(self.detail)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        split.setSizes([560, 200])

        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Prompt"))
        lay.addWidget(self.prompt)
        lay.addWidget(self.prompt_note)
        lay.addLayout(bar)
        lay.addWidget(self.status)
        lay.addWidget(split, 1)

        base = settings.options.sampler
        for _ in range(MIN_COLUMNS):
            self.add_column(base)
        self._update_prompt_note()
        self.resize(1200, 800)

    # -- columns ---------------------------------------------------------------------------

    def add_column(self, settings: SamplerSettings | None = None) -> TokenColumn | None:
        if len(self.columns) >= MAX_COLUMNS:
            self.status.setText(f"At most {MAX_COLUMNS} columns.")
            return None
        if settings is None:
            settings = self.columns[-1].editor.settings() if self.columns else self._settings.options.sampler
        col = TokenColumn(f"Column {len(self.columns) + 1}", settings)
        col.duplicate_requested.connect(self._on_duplicate)
        col.remove_requested.connect(self._on_remove)
        col.take_requested.connect(self.take_into_chat)
        col.token_clicked.connect(self._on_token_clicked)
        self._columns_row.addWidget(col, 1)
        self.columns.append(col)
        self._update_column_buttons()
        return col

    def _on_duplicate(self, col: TokenColumn) -> None:
        try:
            self.add_column(col.editor.settings())
        except ValueError as e:
            self.status.setText(str(e))

    def _on_remove(self, col: TokenColumn) -> None:
        if len(self.columns) > MIN_COLUMNS and not self.running:
            self.columns.remove(col)
            self._columns_row.removeWidget(col)
            col.deleteLater()
            for i, c in enumerate(self.columns):
                c.title.setText(f"<b>Column {i + 1}</b>")
            self._update_column_buttons()

    def _update_column_buttons(self) -> None:
        for c in self.columns:
            c.remove_button.setEnabled(len(self.columns) > MIN_COLUMNS and not self.running)
            c.duplicate_button.setEnabled(len(self.columns) < MAX_COLUMNS and not self.running)
        self.add_button.setEnabled(len(self.columns) < MAX_COLUMNS and not self.running)

    def _on_token_clicked(self, col: TokenColumn, index: int) -> None:
        # Position i of every column came from the same step (and the same draw): select it everywhere.
        for c in self.columns:
            c.body.set_selected(index if index < c.body.rendered_tokens else None)
        if 0 <= index < len(col.events):
            self.detail.show_token(col.events[index], f"{self.columns.index(col) + 1}: token {index + 1}")

    # -- the prompt ------------------------------------------------------------------------

    def _anchored(self) -> bool:
        return self._anchor is not None and self.prompt.toPlainText().strip() == self._anchor[1].content.strip()

    def _update_prompt_note(self) -> None:
        if self._anchored():
            self.prompt_note.setText("Continues the open conversation (its earlier turns are part of the prompt).")
        else:
            self.prompt_note.setText("A new single-turn chat with this message.")

    def messages(self) -> tuple[dict[str, str], ...]:
        if self._anchored():
            conv, user = self._anchor
            return tuple(conv.history(user))
        text = self.prompt.toPlainText().strip()
        if not text:
            raise ValueError("write a prompt first")
        return ({"role": "user", "content": text},)

    # -- running ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def column_settings(self) -> list[SamplerSettings]:
        """Each column's settings with the seed it will run with (ValueError names the column at fault)."""
        out = []
        for i, col in enumerate(self.columns):
            try:
                s = col.editor.settings()
            except ValueError as e:
                raise ValueError(f"column {i + 1}: {e}") from None
            seed = self.seed.value() if self.same_seed.isChecked() else self.seed.value() + i
            out.append(s.with_(seed=seed))
        return out

    def run(self) -> asyncio.Task | None:
        if self.running:
            return self._task
        try:
            messages = self.messages()
            settings = self.column_settings()
        except ValueError as e:
            self.status.setText(str(e))
            return None
        self._set_running(True)  # at once: a second click before the task starts must not start another
        self._task = asyncio.ensure_future(self._run(messages, settings))
        return self._task

    async def _run(self, messages: tuple[dict[str, str], ...], settings: list[SamplerSettings]) -> None:
        self._set_running(True)
        self.divergence = None
        self.summaries = []
        for col in self.columns:
            col.clear()
        try:
            engine = await self._host.wait_engine()
            for i, (col, s) in enumerate(zip(self.columns, settings)):
                self.status.setText(f"Generating column {i + 1} of {len(settings)}…")
                request = GenerationRequest(messages=messages, sampler=s, max_new_tokens=self.max_tokens.value(),
                                            stop=self._settings.options.stop, top_n=TOP_N, record_stages=True)
                col.run_settings = s
                self._stream = stream = TokenStream(engine, request)
                async for batch in stream.batches():
                    col.append(batch)
                self.summaries.append(col.finish(stream.stats))
                col.take_button.setEnabled(True)
                if stream.stats is not None and stream.stats.finish_reason == "cancelled":
                    break
            self._show_divergence()
        except Exception as e:  # noqa: BLE001 - shown in the window; the columns keep what arrived
            log.warning("comparison failed: %s", e, exc_info=not isinstance(e, ValueError))
            self.status.setText(f"Comparison failed: {describe_error(e)}")
        finally:
            self._stream = None
            self._set_running(False)

    def _show_divergence(self) -> None:
        done = [c for c in self.columns if c.stats is not None]
        self.divergence = experiments.first_divergence([c.token_ids for c in done])
        prompt = done[0].stats.prompt_tokens if done else 0
        computed = sum(c.stats.prefilled_tokens for c in done)
        shared = f"prompt {prompt} tokens, {computed} computed over {len(done)} columns"
        if self.divergence is None:
            self.status.setText(f"All columns are identical ({shared}).")
            return
        for c in done:
            mark_tokens(c.body, [self.divergence])
        self.status.setText(f"First divergence at token {self.divergence + 1} ({shared}).")

    def stop(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    def _set_running(self, running: bool) -> None:
        self._running = running
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        for c in self.columns:
            if c.editor is not None:
                c.editor.setEnabled(not running)
            if running:
                c.take_button.setEnabled(False)
        self._update_column_buttons()

    # -- into the chat ---------------------------------------------------------------------

    def take_into_chat(self, col: TokenColumn) -> Message | None:
        """The column's answer becomes a new answer in the conversation (the open one when anchored)."""
        if col.stats is None or col.run_settings is None or self.running:
            return None
        engine = self._host.engine
        if self._anchored():
            conv, user = self._anchor
        else:
            conv = self._library.new()
            user = conv.add_message(None, "user", self.prompt.toPlainText().strip())
            self._anchor = (conv, user)
        if self._library.current is not conv:
            self._library.open(conv.id)
            conv = self._library.current
            user = conv.messages[user.id]
        answer = add_answer(conv, user, col.events, stats=col.stats, sampler=col.run_settings,
                            max_new_tokens=self.max_tokens.value(), stop=self._settings.options.stop,
                            model=model_dict(engine) if engine is not None else None)
        self.status.setText(f"{col.accessibleName()} is now an answer in “{conv.title}”.")
        return answer

    def closeEvent(self, event) -> None:
        if self._task is not None and not self._task.done():
            self.stop()
            self._task.cancel()
        super().closeEvent(event)
