"""One experiment run drawn as a column: optional settings editor, coloured tokens, stats, actions.

Compare shows 2–4 of them side by side, Replay two (the original and the
replay). Tokens are coloured by probability (hover for alternatives, click to
inspect); `mark_tokens` underlines a divergence or a changed position.
"""

from __future__ import annotations

import html

from engine import SAMPLER_CONTROLS, GenerationStats, SamplerSettings, TokenEvent
from engine import experiments
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QDoubleSpinBox, QFrame, QGridLayout, QHBoxLayout, QLabel, QPushButton, QSpinBox, QVBoxLayout, QWidget,
)

from app.theme import is_dark
from app.widgets.chat.message_body import MessageBody

DIVERGENCE_COLOR = QColor(200, 30, 160)
CHANGED_COLOR = QColor(220, 120, 0)

# The knobs a column edits (the rest come from the chat's settings); each box's label, range, step and decimals are
# its control's in the engine's stage registry (`SAMPLER_CONTROLS`), as in the sampling panel.
EDITED_FIELDS: tuple[str, ...] = (
    "temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty", "xtc_probability",
)


class SettingsEditor(QWidget):
    """Spin boxes for the common sampler knobs over a base `SamplerSettings`."""

    changed = Signal()

    def __init__(self, settings: SamplerSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self._base = settings
        self.boxes: dict[str, QSpinBox | QDoubleSpinBox] = {}
        self.labels: dict[str, QLabel] = {}
        grid = QGridLayout(self)  # two label/box pairs per row: the columns stay short
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setVerticalSpacing(2)
        for i, name in enumerate(EDITED_FIELDS):
            c = SAMPLER_CONTROLS[name]
            box: QSpinBox | QDoubleSpinBox
            if c.decimals == 0:  # a whole number (top-k)
                box = QSpinBox()
                box.setRange(int(c.minimum), int(c.maximum))
                box.setSingleStep(int(c.step))
            else:
                box = QDoubleSpinBox()
                box.setDecimals(c.decimals)
                box.setRange(c.minimum, c.maximum)
                box.setSingleStep(c.step)
            box.setSpecialValueText(c.special)
            box.setToolTip(c.tip)
            box.setValue(getattr(settings, name))
            box.setAccessibleName(c.label)
            box.valueChanged.connect(lambda _v: self.changed.emit())
            self.boxes[name] = box
            self.labels[name] = label = QLabel(c.label)
            label.setToolTip(c.tip)
            row, col = divmod(i, 2)
            grid.addWidget(label, row, 2 * col)
            grid.addWidget(box, row, 2 * col + 1)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)

    def settings(self) -> SamplerSettings:
        """The edited settings (raises ValueError, in words, when they are invalid)."""
        values = {name: (int(b.value()) if isinstance(b, QSpinBox) else round(b.value(), 4)) for name, b in self.boxes.items()}
        return self._base.with_(**values)

    def set_value(self, name: str, value: float) -> None:
        box = self.boxes[name]
        if isinstance(box, QSpinBox):  # an integer field (top-k): rounded, where Qt would cut 39.9 to 39
            box.setValue(round(value))
        else:
            box.setValue(value)


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


# How a column's run ended, in words (the engine's "eos", "length" are its own names).
FINISH_WORDS = {
    "eos": "ended",
    "stop": "ended at a stop string",
    "length": "cut off at the length limit",
    "cancelled": "stopped",
    "interrupted": "interrupted",
}


def stats_text(s: experiments.ColumnStats) -> str:
    finish = FINISH_WORDS.get(s.finish_reason, s.finish_reason)
    return (
        f"{s.length} tokens · {finish} · {s.mean_surprisal_bits:.2f} bits/token · "
        f"entropy {s.mean_entropy:.2f} nats · distinct-2 {s.distinct_2:.2f} · "
        f"repeated 3-grams {s.repeated_ngrams} · {s.tokens_per_s:.1f} tok/s"
    )


class TokenColumn(QFrame):
    """One run: optional settings editor, coloured tokens, stats, and its actions.

    `events` and `stats` are what the column shows; the run that made them owns them.
    """

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
        self.stats_label.setTextFormat(Qt.TextFormat.PlainText)
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

    def finish(self, stats: GenerationStats | None, summary: experiments.ColumnStats) -> None:
        """The run ended: show its numbers."""
        self.stats = stats
        self.stats_label.setText(stats_text(summary))

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]
