"""Replay an answer with its seed and settings, or with one setting changed, and show the token diff.

"Replay" regenerates with the stored seed and settings: the tokens come out
identical. "Replay with…" changes one field first. Both runs take the same
random draw at each step, so a step's token changes only where the change
altered the survivors there; the first divergence and every position that
differs are marked in both columns. The replay can be kept as a branch.

Only the model that made the answer can reproduce it: on another one the
window says which model made it and offers to load that one. The run itself
belongs to the `ExperimentController` (a `ReplayRun`); this window draws it.
"""

from __future__ import annotations

import asyncio
from dataclasses import fields

from engine import SamplerSettings
from engine import experiments
from PySide6.QtCore import Qt
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.controllers.engine_host import EngineHost
from app.controllers.experiment import ExperimentController, ReplayRun
from app.state.answer_recipe import AnswerRecipe, describe_model, recipe_for
from app.state.conversation import Conversation, Message
from app.widgets.inspection.token_column import CHANGED_COLOR, TokenColumn, mark_tokens, stats_text
from app.widgets.inspection.token_detail import TokenDetail
from app.widgets.escape_closes import close_on_escape
from app.state.steering_state import SteeringState
from app.widgets.steering.steering_knob import SteeringKnob
from app.window_geometry import fit_to_screen

# Fields "Replay with…" offers; the seed is what a replay keeps, so it is not among them.
REPLAY_FIELDS = tuple(f.name for f in fields(SamplerSettings) if f.name not in ("seed",))


def parse_value(settings: SamplerSettings, name: str, text: str) -> object:
    """`text` as the type of `settings.<name>`; ValueError in words."""
    current = getattr(settings, name)
    text = text.strip()
    try:
        if name == "order":
            return tuple(s.strip() for s in text.split(",") if s.strip())
        if isinstance(current, int) and not isinstance(current, bool):
            return int(text)
        return float(text)
    except ValueError:
        raise ValueError(f"{name} needs a {'whole ' if isinstance(current, int) else ''}number, got {text!r}") from None


class ReplayView(QWidget):
    def __init__(self, conv: Conversation, message: Message, host: EngineHost, *, with_change: bool,
                 parent: QWidget | None = None, controller: ExperimentController | None = None,
                 steering: SteeringState | None = None):
        """ValueError when `message` cannot be replayed (it stored no settings or seed)."""
        super().__init__(parent, Qt.WindowType.Window)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.setWindowTitle("Replay with a change" if with_change else "Replay")
        close_on_escape(self)
        self.setAccessibleName(self.windowTitle())
        self._conv, self._message = conv, message
        self._experiments = controller or ExperimentController(host, steering=steering)
        # ValueError when it cannot be replayed (no settings or seed; a steering vector no longer at hand)
        self.recipe: AnswerRecipe = recipe_for(conv, message, self._experiments.find_vector)
        self.steering_knob = SteeringKnob(self.recipe.steering, steering)  # strength 0: what steering changed
        self._run: ReplayRun | None = None  # the last replay started here
        self._loading: asyncio.Task | None = None  # loading the answer's own model, then replaying

        self.field = QComboBox()
        self.field.addItems(REPLAY_FIELDS)
        self.field.setAccessibleName("Setting to change")
        self.value = QLineEdit()
        self.value.setAccessibleName("New value")
        self.field.currentTextChanged.connect(self._on_field_changed)
        self.field.setCurrentText("top_p")
        self._on_field_changed("top_p")
        self.run_button = QPushButton("Replay")
        self.run_button.clicked.connect(lambda: self.run())
        self.keep_button = QPushButton("Keep as branch")
        self.keep_button.setToolTip("Add the replay to the conversation as a new version of this answer")
        self.keep_button.setEnabled(False)
        self.keep_button.clicked.connect(lambda: self.keep())
        made_by = describe_model(self.recipe.model) if self.recipe.model else "the model that made the answer"
        self.load_button = QPushButton(f"Load {made_by} and replay")
        self.load_button.setToolTip("Replace the loaded model with the one that made this answer (the chat uses it too)")
        self.load_button.clicked.connect(lambda: self.load_and_replay())
        self.load_button.hide()
        bar = QHBoxLayout()
        if with_change:
            for w in (QLabel("Change"), self.field, QLabel("to"), self.value):
                bar.addWidget(w)
        else:
            self.field.hide()
            self.value.hide()
        for button in (self.run_button, self.keep_button):
            bar.addWidget(button)
        bar.addStretch(1)
        self.summary = QLabel(f"Seed {self.recipe.sampler.seed}; settings as stored with the answer.")
        self.summary.setTextFormat(Qt.TextFormat.PlainText)  # token texts and errors are text, never markup
        self.summary.setWordWrap(True)
        self.summary.setAccessibleName("Replay summary")

        self.original = TokenColumn("Original", None)
        self.replay = TokenColumn("Replay", None)
        for c in (self.original, self.replay):
            c.take_button.hide()
            c.token_clicked.connect(self._on_token_clicked)
        self.original.show_events(conv.tokens(message))
        self.original.stats_label.setText(stats_text(experiments.column_stats(
            self.original.events, message.finish_reason or "interrupted", (message.stats or {}).get("decode_tokens_per_s", 0.0))))
        self.replay.show_events(list(self.recipe.prefix))
        cols = QHBoxLayout()
        cols.addWidget(self.original, 1)
        cols.addWidget(self.replay, 1)
        self.detail = TokenDetail()
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.steering_knob)
        # The load button (its text names a model, maybe a long one) sits beside the summary, which wraps:
        # in the bar it widened the window past a small screen.
        said = QHBoxLayout()
        said.addWidget(self.summary, 1)
        said.addWidget(self.load_button)
        lay.addLayout(said)
        lay.addLayout(cols, 3)
        lay.addWidget(self.detail, 1)
        fit_to_screen(self, 1100, 760)  # no larger than the screen (a 1024x700 one)
        self._refuse_another_model(self._experiments.model_mismatch(self.recipe))

    @property
    def diff(self) -> experiments.TokenDiff | None:
        """The last replay's token diff against the original (None until one finished)."""
        return self._run.diff if self._run is not None else None

    def _on_field_changed(self, name: str) -> None:
        v = getattr(self.recipe.sampler, name)
        self.value.setText(",".join(v) if isinstance(v, tuple) else str(v))

    def replay_settings(self) -> SamplerSettings:
        if self.field.isHidden():
            return self.recipe.sampler
        name = self.field.currentText()
        return self.recipe.sampler.with_(**{name: parse_value(self.recipe.sampler, name, self.value.text())})

    def run(self) -> asyncio.Task | None:
        """Start the replay; the task ends with it (None when the new value is invalid)."""
        if self._run is not None and self._run.running:
            return self._run.task
        try:
            run = self._experiments.replay(self._conv, self._message, self.replay_settings(),
                                           self.steering_knob.steering())
        except ValueError as e:
            self.summary.setText(str(e))
            return None
        self._run = run
        run.tokens.connect(self.replay.append)
        run.finished.connect(self._on_finished)
        self.run_button.setEnabled(False)
        self.keep_button.setEnabled(False)
        self.replay.show_events(list(self.recipe.prefix))
        self.replay.stats = None
        return run.task

    def _on_finished(self) -> None:
        run = self._run
        assert run is not None  # `finished` is connected only to the run just stored in self._run
        self.run_button.setEnabled(True)
        if run.error is not None:
            if run.other_model is not None:
                self._refuse_another_model(run.error)
            else:
                self.summary.setText(f"Replay failed: {run.error}")
            return
        if run.result.summary is None:  # closed or cancelled before it ran
            return
        self.load_button.hide()
        self.replay.finish(run.result.stats, run.result.summary)
        self._show_diff(run)
        self.keep_button.setEnabled(True)

    def _refuse_another_model(self, reason: str | None) -> None:
        """Say which model made the answer, and offer to load it (None: the loaded model is the right one)."""
        if reason is not None:
            self.summary.setText(reason)
            self.load_button.setVisible(bool(self.recipe.model and self.recipe.model.get("spec")))

    def load_and_replay(self) -> asyncio.Task:
        """Load the model that made the answer, then replay on it."""
        if self._loading is None or self._loading.done():
            self._loading = asyncio.ensure_future(self._load_and_replay())
        return self._loading

    async def _load_and_replay(self) -> None:
        self.load_button.setEnabled(False)
        self.run_button.setEnabled(False)
        self.summary.setText(f"Loading {describe_model(self.recipe.model)}…")
        try:
            await self._experiments.load_model_of(self.recipe)
        except (RuntimeError, ValueError) as e:  # it failed, or another load is under way
            self.summary.setText(f"Could not load {describe_model(self.recipe.model)}: {e}")
            return
        finally:
            self.load_button.setEnabled(True)
            self.run_button.setEnabled(True)
        self.load_button.hide()
        task = self.run()
        if task is not None:
            await asyncio.shield(task)

    def _show_diff(self, run: ReplayRun) -> None:
        d, settings = run.diff, run.result.settings
        assert d is not None  # the run sets its diff right after its summary, before `finished`
        a, b = self.original.token_ids, self.replay.token_ids
        what = ", ".join(f"{k} {old} → {new}" for k, (old, new) in run.changed.items()) or "nothing changed"
        v = run.verdict  # the tokens and their log-probs bit for bit, and what the fingerprints say differs
        record = f" {v.fingerprint_text()[:1].upper()}{v.fingerprint_text()[1:]}." if v is not None else ""
        first = d.first_divergence
        if first is None:  # the same tokens: identical bit for bit, or log-probs that moved (by how much, in nats)
            head = "Identical" if v is None or v.identical else v.headline()[:1].upper() + v.headline()[1:]
            self.summary.setText(f"{head}: all {len(a)} tokens match ({what}; seed {settings.seed}).{record}")
            return
        # Up to the first divergence the runs saw the same text, so these positions are where the change mattered.
        self.original.body.set_selected(None)
        mark_tokens(self.original.body, [first])
        mark_tokens(self.replay.body, [first])
        later = [i for i in d.changed if i > first]
        mark_tokens(self.original.body, later, CHANGED_COLOR)
        mark_tokens(self.replay.body, later, CHANGED_COLOR)
        # One numbering (tokens from 1, as the token detail says) and one statement of where it diverged: the
        # verdict's. With nothing changed, nothing "did not alter what could be drawn": the record says why.
        head = v.headline() if v is not None else f"diverged at token {first + 1}"
        before = ("the change did not alter what could be drawn before it" if run.changed
                  else "the same tokens before it")
        self.summary.setText(
            f"{head[:1].upper()}{head[1:]} ({what}; seed {settings.seed}); {len(d.changed)} of "
            f"{max(len(a), len(b))} positions differ, {before}.{record}"
        )

    def _on_token_clicked(self, col: TokenColumn, index: int) -> None:
        for c in (self.original, self.replay):
            c.body.set_selected(index)
        if 0 <= index < len(col.events):
            self.detail.show_token(col.events[index], f"{col.accessibleName()}: token {index + 1}")

    def keep(self) -> Message | None:
        """The replay becomes a new version of the answer (a sibling)."""
        if self._run is None or self._run.running or self._run.result.stats is None:
            return None
        answer = self._experiments.keep_replay(self._run, self._conv, self._message)
        self.keep_button.setEnabled(False)
        self.summary.setText(self.summary.text() + " Kept as a new version of the answer.")
        return answer

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._run is not None:  # it ends after this window: nothing to draw into
            self._run.tokens.disconnect(self.replay.append)
            self._run.finished.disconnect(self._on_finished)
            self._run.abandon()
        if self._loading is not None:
            self._loading.cancel()
        super().closeEvent(event)
