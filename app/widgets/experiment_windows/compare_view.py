"""Chat ▸ Compare settings…: one prompt, 2–4 columns of sampler settings, the same seed, aligned tokens.

Columns generate one after another on the loaded model; the engine finds the
shared prompt in its KV cache, so only the first column computes it. With the
same seed every column takes the same random draw at each step, so the
columns agree until the settings change the survivors somewhere: that first
divergence is marked (wavy underline) in every column. Each column shows its
tokens coloured by probability (hover for alternatives, click to inspect
below), its stats, and can be taken into the chat as a new answer.

The run itself belongs to the `ExperimentController` (a `CompareRun`): this
window reads the prompt and settings, starts the run, and draws its signals.
"""

from __future__ import annotations

import asyncio
import secrets

from engine import SamplerSettings, experiments
from PySide6.QtCore import Qt
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QCheckBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QScrollArea, QSpinBox, QSplitter, QVBoxLayout, QWidget,
)

from app.controllers.engine_host import EngineHost
from app.controllers.experiment import CompareRun, ExperimentController
from app.state.notebook import Prompt, prompt_for
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.settings import SettingsState
from app.widgets.inspection.token_column import TokenColumn, mark_tokens
from app.widgets.inspection.token_detail import TokenDetail
from app.widgets.escape_closes import close_on_escape
from app.state.steering_state import SteeringState
from app.widgets.steering.steering_knob import SteeringKnob
from app.window_geometry import fit_to_screen

MIN_COLUMNS, MAX_COLUMNS = 2, 4


def _edited_settings(col: TokenColumn) -> SamplerSettings:
    """The settings in `col`'s editor (ValueError in words when a field is invalid)."""
    assert col.editor is not None  # add_column always gives its columns settings, so each has an editor
    return col.editor.settings()


class CompareView(QWidget):
    """A window: the prompt, the columns, and the clicked token's details."""

    def __init__(self, library: Library, settings: SettingsState, host: EngineHost,
                 anchor: tuple[Conversation, Message] | None = None, parent: QWidget | None = None, *,
                 controller: ExperimentController | None = None, steering: SteeringState | None = None):
        """`controller` runs the comparisons (the window's own, when it has one; else one for this view);
        `steering`: the Steering panel's, offered to every column."""
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Compare settings")
        close_on_escape(self)
        self.setAccessibleName("Compare settings")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self._settings = settings
        self._experiments = controller or ExperimentController(host, library)
        self._anchor = anchor  # (conversation, user message) the prompt comes from
        self._run: CompareRun | None = None  # the last run started here
        self._ran: list[TokenColumn] = []  # the columns that run draws into, by its column index
        self.columns: list[TokenColumn] = []

        self.prompt = QPlainTextEdit()
        self.prompt.setAccessibleName("Prompt")
        self.prompt.setMaximumHeight(90)
        self.prompt_note = QLabel()
        self.prompt_note.setTextFormat(Qt.TextFormat.PlainText)
        self.prompt_note.setWordWrap(True)
        if anchor is not None:
            self.prompt.setPlainText(anchor[1].content)
        self.prompt.textChanged.connect(self._update_prompt_note)
        self.steering_knob = SteeringKnob(None, steering, use_panel=True)  # the panel's vectors, every column

        bar = self._build_run_bar()
        self.status = QLabel()
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # errors quote the user's and the model's text
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
        for part in (QLabel("Prompt"), self.prompt, self.prompt_note, self.steering_knob):
            lay.addWidget(part)
        lay.addLayout(bar)
        lay.addWidget(self.status)
        lay.addWidget(split, 1)

        for _ in range(MIN_COLUMNS):
            self.add_column(settings.options.sampler)
        self._update_prompt_note()
        fit_to_screen(self, 1200, 800)  # no larger than the screen (a 1024x700 one)

    def _build_run_bar(self) -> QHBoxLayout:
        """Run, Stop, Add column, the answers' length and the seed (the same in every column, or not)."""
        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.add_button = QPushButton("Add column")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(min(self._settings.options.max_new_tokens, 128))
        self.max_tokens.setAccessibleName("Max new tokens")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        current_seed = self._settings.options.sampler.seed
        self.seed.setValue(current_seed if current_seed is not None and current_seed < 2**31 else secrets.randbelow(2**31))
        self.seed.setAccessibleName("Seed")
        self.same_seed = QCheckBox("Same seed in every column")
        self.same_seed.setChecked(True)
        self.same_seed.setToolTip("The same random draw at every step, so differences come from the settings alone")
        self.run_button.clicked.connect(lambda: self.run())
        self.stop_button.clicked.connect(self.stop)
        self.add_button.clicked.connect(lambda: self.add_column())
        bar = QHBoxLayout()
        for button in (self.run_button, self.stop_button, self.add_button):
            bar.addWidget(button)
        bar.addSpacing(12)
        for control in (QLabel("Max tokens"), self.max_tokens, QLabel("Seed"), self.seed, self.same_seed):
            bar.addWidget(control)
        bar.addStretch(1)
        return bar

    # -- columns ---------------------------------------------------------------------------

    def add_column(self, settings: SamplerSettings | None = None) -> TokenColumn | None:
        if len(self.columns) >= MAX_COLUMNS:
            self.status.setText(f"At most {MAX_COLUMNS} columns.")
            return None
        if settings is None:
            settings = _edited_settings(self.columns[-1]) if self.columns else self._settings.options.sampler
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
            self.add_column(_edited_settings(col))
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
            note = "Continues the open conversation (its earlier turns are part of the prompt)."
        else:
            note = "A new single-turn chat with this message."
        constraint = self._settings.options.constraint
        if constraint is not None:  # the Sampling panel's structured output holds every column
            note += f" Every column is held to the structured output ({constraint.label})."
        self.prompt_note.setText(note)

    def messages(self) -> "tuple[dict[str, str], ...] | Prompt":
        if self._anchor is not None and self._anchored():  # (_anchored() checks it too; this says so to mypy)
            conv, user = self._anchor
            prompt = prompt_for(conv, user)  # a notebook's text before the answer (raw), else the chat
            return prompt if prompt.text is not None else tuple(conv.history(user))
        text = self.prompt.toPlainText().strip()
        if not text:
            raise ValueError("write a prompt first")
        return ({"role": "user", "content": text},)

    # -- running ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._run is not None and self._run.running

    @property
    def divergence(self) -> int | None:
        """The first position where the last run's columns differ (None: identical, or not run)."""
        return self._run.divergence if self._run is not None else None

    @property
    def summaries(self) -> list[experiments.ColumnStats]:
        """The last run's finished columns, in numbers."""
        return [c.summary for c in self._run.done if c.summary is not None] if self._run is not None else []

    def column_settings(self) -> list[SamplerSettings]:
        """Each column's settings with the seed it will run with (ValueError names the column at fault)."""
        out = []
        for i, col in enumerate(self.columns):
            try:
                s = _edited_settings(col)
            except ValueError as e:
                raise ValueError(f"column {i + 1}: {e}") from None
            seed = self.seed.value() if self.same_seed.isChecked() else self.seed.value() + i
            out.append(s.with_(seed=seed))
        return out

    def run(self) -> asyncio.Task | None:
        """Start a comparison of every column; the task ends with the run (None when the input is invalid)."""
        if self._run is not None and self._run.running:  # self.running
            return self._run.task
        self._update_prompt_note()  # the structured output may have changed since the window opened
        try:
            run = self._experiments.compare(self.messages(), self.column_settings(), max_new_tokens=self.max_tokens.value(),
                                            stop=self._settings.options.stop,
                                            constraint=self._settings.options.constraint,
                                            steering=self.steering_knob.steering())
        except ValueError as e:
            self.status.setText(str(e))
            return None
        self._run, self._ran = run, list(self.columns)
        for signal, slot in self._subscriptions(run):
            signal.connect(slot)
        for col in self.columns:
            col.clear()
        self._set_running(True)
        return run.task

    def _on_column_started(self, index: int) -> None:
        self.status.setText(f"Generating column {index + 1} of {len(self._ran)}…")

    def _on_tokens(self, index: int, batch: list) -> None:
        self._ran[index].append(batch)

    def _on_column_finished(self, index: int) -> None:
        assert self._run is not None  # the run's signals are connected only once it is stored in self._run
        result = self._run.columns[index]
        assert result.summary is not None  # a column's summary is set when it ends, before `column_finished`
        self._ran[index].finish(result.stats, result.summary)
        self._ran[index].take_button.setEnabled(True)

    def _on_finished(self) -> None:
        run = self._run
        assert run is not None  # the run's signals are connected only once it is stored in self._run
        self._set_running(False)
        done = run.done
        if run.error is not None or not done:
            self.status.setText(f"Comparison failed: {run.error}" if run.error else "Stopped before any column ran.")
            return
        stats = [c.stats for c in done if c.stats is not None]  # all of them: `done` is the columns with stats
        prompt = stats[0].prompt_tokens
        computed = sum(s.prefilled_tokens for s in stats)
        shared = f"prompt {prompt} tokens, {computed} computed over {len(done)} columns"
        if run.divergence is None:
            self.status.setText(f"All columns are identical ({shared}).")
            return
        for col, result in zip(self._ran, run.columns):
            if result.stats is not None:
                mark_tokens(col.body, [run.divergence])
        self.status.setText(f"First divergence at token {run.divergence + 1} ({shared}).")

    def stop(self) -> None:
        if self._run is not None:
            self._run.cancel()

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        for c in self.columns:
            if c.editor is not None:
                c.editor.setEnabled(not running)
            if running:
                c.take_button.setEnabled(False)
        self._update_column_buttons()

    def _subscriptions(self, run: CompareRun) -> tuple:
        return ((run.column_started, self._on_column_started), (run.tokens, self._on_tokens),
                (run.column_finished, self._on_column_finished), (run.finished, self._on_finished))

    # -- into the chat ---------------------------------------------------------------------

    def take_into_chat(self, col: TokenColumn) -> Message | None:
        """The column's answer becomes a new answer in the conversation (the open one when anchored)."""
        if self.running or self._run is None or col not in self._ran:
            return None
        result = self._run.columns[self._ran.index(col)]
        if result.stats is None:
            return None
        anchor = self._anchor if self._anchored() else None
        self._anchor, answer = self._experiments.take_into_chat(result, anchor, self.prompt.toPlainText())
        self.status.setText(f"{col.accessibleName()} is now an answer in “{self._anchor[0].title}”.")
        return answer

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._run is not None:
            for signal, slot in self._subscriptions(self._run):  # it ends after this window: nothing to draw into
                signal.disconnect(slot)
            self._run.abandon()
        super().closeEvent(event)
