"""The clicked token's alternatives and sampler stages, below an experiment's columns."""

from __future__ import annotations

import html

from engine import TokenEvent
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QTabWidget, QVBoxLayout, QWidget

from app.widgets.chat.constraint_marks import constraint_summary
from app.widgets.fmt import bits, pct, visible
from app.widgets.inspection.prob_table import ProbTable
from app.widgets.inspection.stage_view import StageView


class TokenDetail(QTabWidget):
    """The clicked token's alternatives and sampler stages (the inspector's views)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.label = QLabel("Click a token to see its alternatives and what each sampler stage did.")
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)  # our markup; the token, numbers and notes are escaped
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
                f"p {html.escape(pct(ev.prob))} · rank {ev.rank + 1} · {html.escape(bits(ev.logprob))} · entropy {ev.entropy:.2f} nats"
                + (f"<br><b>{html.escape(ev.rewind.describe(), quote=False)}</b>" if ev.rewind is not None else "")
                + (f"<br>{html.escape(constraint_summary(ev), quote=False)}" if ev.constraint is not None else "")
            )
