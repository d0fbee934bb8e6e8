"""Replay an answer with its seed and settings, or with one setting changed, and show the token diff.

"Replay" regenerates with the stored seed and settings: the tokens come out
identical. "Replay with…" changes one field first. Both runs take the same
random draw at each step, so a step's token changes only where the change
altered the survivors there; the first divergence and every position that
differs are marked in both columns. The replay can be kept as a branch.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import fields, replace

from engine import SamplerSettings
from engine import experiments
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.engine_host import EngineHost, describe_error
from app.experiments import AnswerRecipe, add_answer, answer_parent, model_dict, recipe_for
from app.state.conversation import Conversation, Message
from app.token_stream import TokenStream
from app.widgets.compare_view import TokenColumn, TokenDetail, mark_tokens, stats_text

log = logging.getLogger(__name__)

CHANGED_COLOR = QColor(220, 120, 0)
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
                 parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.setWindowTitle("Replay with a change" if with_change else "Replay")
        self.setAccessibleName(self.windowTitle())
        self._conv, self._message, self._host = conv, message, host
        self.recipe: AnswerRecipe = recipe_for(conv, message)  # ValueError when it cannot be replayed
        self.diff: experiments.TokenDiff | None = None
        self._task: asyncio.Task | None = None
        self._stream: TokenStream | None = None
        self._settings: SamplerSettings | None = None

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
        bar = QHBoxLayout()
        if with_change:
            bar.addWidget(QLabel("Change"))
            bar.addWidget(self.field)
            bar.addWidget(QLabel("to"))
            bar.addWidget(self.value)
        else:
            self.field.hide()
            self.value.hide()
        bar.addWidget(self.run_button)
        bar.addWidget(self.keep_button)
        bar.addStretch(1)
        self.summary = QLabel(f"Seed {self.recipe.sampler.seed}; settings as stored with the answer.")
        self.summary.setWordWrap(True)
        self.summary.setAccessibleName("Replay summary")

        self.original = TokenColumn("Original", None)
        self.replay = TokenColumn("Replay", None)
        for c in (self.original, self.replay):
            c.take_button.hide()
            c.token_clicked.connect(self._on_token_clicked)
        prefix = list(self.recipe.prefix)
        self.original.show_events(conv.tokens(message))
        self.original.stats_label.setText(stats_text(experiments.column_stats(
            self.original.events, message.finish_reason or "interrupted", (message.stats or {}).get("decode_tokens_per_s", 0.0))))
        self.replay.show_events(prefix)
        cols = QHBoxLayout()
        cols.addWidget(self.original, 1)
        cols.addWidget(self.replay, 1)
        self.detail = TokenDetail()
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.summary)
        lay.addLayout(cols, 3)
        lay.addWidget(self.detail, 1)
        self.resize(1100, 760)

    def _on_field_changed(self, name: str) -> None:
        v = getattr(self.recipe.sampler, name)
        self.value.setText(",".join(v) if isinstance(v, tuple) else str(v))

    def replay_settings(self) -> SamplerSettings:
        if self.field.isHidden():
            return self.recipe.sampler
        name = self.field.currentText()
        return self.recipe.sampler.with_(**{name: parse_value(self.recipe.sampler, name, self.value.text())})

    def run(self) -> asyncio.Task | None:
        if self._task is not None and not self._task.done():
            return self._task
        try:
            settings = self.replay_settings()
        except ValueError as e:
            self.summary.setText(str(e))
            return None
        self._task = asyncio.ensure_future(self._run(settings))
        return self._task

    async def _run(self, settings: SamplerSettings) -> None:
        self.run_button.setEnabled(False)
        self.keep_button.setEnabled(False)
        prefix = list(self.recipe.prefix)
        self.replay.show_events(prefix)
        self.replay.stats = None
        self._settings = settings
        try:
            engine = await self._host.wait_engine()
            self._stream = stream = TokenStream(engine, self.recipe.request(settings))
            offset = len(prefix)
            async for batch in stream.batches():
                self.replay.append([replace(e, index=offset + e.index) for e in batch])
            self.replay.finish(stream.stats)
            self._show_diff(settings)
            self.keep_button.setEnabled(True)
        except Exception as e:  # noqa: BLE001 - shown in the window
            log.warning("replay failed: %s", e, exc_info=not isinstance(e, ValueError))
            self.summary.setText(f"Replay failed: {describe_error(e)}")
        finally:
            self._stream = None
            self.run_button.setEnabled(True)

    def _show_diff(self, settings: SamplerSettings) -> None:
        a, b = self.original.token_ids, self.replay.token_ids
        self.diff = d = experiments.token_diff(a, b)
        change = experiments.changed_fields(self.recipe.sampler, settings)
        what = ", ".join(f"{k} {old} → {new}" for k, (old, new) in change.items()) or "nothing changed"
        if d.identical:
            self.summary.setText(f"Identical: all {len(a)} tokens match ({what}; seed {settings.seed}).")
            return
        # Up to the first divergence the runs saw the same text, so these positions are where the change mattered.
        self.original.body.set_selected(None)
        mark_tokens(self.original.body, [d.first_divergence])
        mark_tokens(self.replay.body, [d.first_divergence])
        later = [i for i in d.changed if i > d.first_divergence]
        mark_tokens(self.original.body, later, CHANGED_COLOR)
        mark_tokens(self.replay.body, later, CHANGED_COLOR)
        self.summary.setText(
            f"First divergence at token {d.first_divergence + 1} ({what}; seed {settings.seed}); "
            f"{len(d.changed)} of {max(len(a), len(b))} positions differ. Tokens before it are identical: "
            "the change did not alter what could be drawn there."
        )

    def _on_token_clicked(self, col: TokenColumn, index: int) -> None:
        for c in (self.original, self.replay):
            c.body.set_selected(index)
        if 0 <= index < len(col.events):
            self.detail.show_token(col.events[index], f"{col.accessibleName()}: token {index + 1}")

    def keep(self) -> Message | None:
        """The replay becomes a new version of the answer (a sibling)."""
        if self.replay.stats is None or self._settings is None:
            return None
        engine = self._host.engine
        user = answer_parent(self._conv, self._message)
        answer = add_answer(
            self._conv, user, self.replay.events, stats=self.replay.stats, sampler=self._settings,
            max_new_tokens=self.recipe.max_new_tokens, stop=self.recipe.stop,
            model=model_dict(engine) if engine is not None else None,
            branch_index=self._message.branch_index,
        )
        self.keep_button.setEnabled(False)
        self.summary.setText(self.summary.text() + " Kept as a new version of the answer.")
        return answer

    def closeEvent(self, event) -> None:
        if self._stream is not None:
            self._stream.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        super().closeEvent(event)
