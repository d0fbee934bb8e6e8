"""What each sampler stage did to one token's distribution: a column per stage, a row per candidate.

The header of each column says how many tokens survive the stage, what share
of the incoming probability mass they hold, and the entropy after it; each
cell is the candidate's probability after that stage, "cut" when the stage
removed it, or "banned" when a logit bias of -inf or a banned string took it
out. A step back for a banned string is said above the table.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from engine import StageSnapshot, TokenEvent, TokenProb
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QResizeEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from app.widgets.inspection.bars import CHOSEN_ROLE, MISSING_ROLE, PROB_ROLE, BarDelegate
from app.widgets.fmt import visible
from app.widgets.inspection.removal import BANNED_STAGE, removed_by

MAX_ROWS = 20
_MISSING_TIPS = {
    "cut": "removed by this stage",
    "banned": "banned: a logit bias of -inf (or a banned string) removed it",
    "·": "not among the top candidates recorded for this stage (still possible, but less likely than those shown)",
}
COLUMN_WIDTH = 54  # the least a bar with "24.1%" on it needs
TOKEN_WIDTH = 84  # the token column's least width; it grows to its longest token where the stage columns leave room


class StageView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setForegroundRole(self.note.foregroundRole().PlaceholderText)
        self.table = QTableWidget()
        self.table.setAccessibleName("Sampler stages")
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self._bars = BarDelegate(self.table)
        self.table.verticalHeader().setVisible(False)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        header = self.table.horizontalHeader()
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        small = header.font()
        small.setPointSizeF(small.pointSizeF() * 0.88)  # three header lines in narrow columns
        header.setFont(small)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(self.note)
        lay.addWidget(self.table, 1)
        self._mono = QFont("monospace")
        self._mono.setStyleHint(QFont.StyleHint.Monospace)
        self.show_token(None)

    def show_token(self, ev: TokenEvent | None) -> None:
        self.table.clear()
        if ev is None:
            self.table.setRowCount(0)
            self.table.setColumnCount(0)
            self.note.setText("Select a token to see what each sampler stage did.")
            return
        stages = ev.stages or ()
        self._say_what_ran(ev, stages)
        self._set_headers(ev, stages)
        rows = _candidates(ev)
        self.table.setRowCount(len(rows))
        model = {p.token_id: p.prob for p in ev.top_model}
        for r, p in enumerate(rows):
            self._fill_row(r, p, ev, stages, model)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        # Stage columns share the width; below COLUMN_WIDTH each, the table scrolls sideways.
        header.setMinimumSectionSize(COLUMN_WIDTH)
        for c in range(1, self.table.columnCount()):
            self.table.setItemDelegateForColumn(c, self._bars)
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.Stretch)
        self._fit_token_column()
        self.table.resizeRowsToContents()

    def _say_what_ran(self, ev: TokenEvent, stages: Sequence[StageSnapshot]) -> None:
        """The note above the table: which stages ran in which order, their notes, a step back."""
        greedy = _greedy(ev)
        if not stages and greedy:
            self.note.setText("Greedy (temperature 0): the model's most likely token was taken; no other stage was on.")
        elif not stages:
            self.note.setText("Every stage was at its neutral value: the sampler drew from the model's distribution as is.")
        else:
            order = " → ".join(s.stage.replace("_", "-") for s in stages)
            pick = " → greedy (temperature 0: the most likely token left was taken)" if greedy else ""
            self.note.setText(
                f"{order}{pick}. Each column is the distribution after that stage; its header: tokens left · "
                "share of the incoming probability kept · entropy (nats)."
            )
        notes = list(dict.fromkeys(s.note for s in stages if s.note))  # e.g. "top 20 from server", said once
        if notes:
            self.note.setText(f"{self.note.text()} <b>{'; '.join(html.escape(n) for n in notes).capitalize()}.</b>")
        if ev.rewind is not None:  # a banned string: the answer stepped back to here
            back = ev.rewind
            taken = f"{back.withdrawn} token{'s were' if back.withdrawn != 1 else ' was'} taken back"
            self.note.setText(
                f"{self.note.text()} <b>Stepped back: the answer would have written the banned string "
                f"{html.escape(repr(back.phrase))}, so {taken} and {html.escape(repr(back.banned_token_text))} is banned here.</b>")

    def _set_headers(self, ev: TokenEvent, stages: Sequence[StageSnapshot]) -> None:
        """A column per stage after Token and Model; each header says what survived it."""
        self.table.setColumnCount(2 + len(stages))
        headers = ["Token", f"model\nall\nH {ev.entropy:.2f}"]
        for s in stages:
            headers.append(f"{s.stage.replace('_', '-')}\n{_count(s.survivors)} · {s.mass_kept:.0%}\nH {s.entropy:.2f}")
        self.table.setHorizontalHeaderLabels(headers)
        for c, s in enumerate(stages, start=2):
            header_item = self.table.horizontalHeaderItem(c)
            assert header_item is not None, "setHorizontalHeaderLabels just made an item for every column"
            header_item.setToolTip(
                f"{s.stage}: {s.survivors:,} tokens survive, holding {s.mass_kept:.1%} of the probability "
                f"that entered the stage; entropy after it {s.entropy:.3f} nats"
            )

    def _fill_row(self, r: int, p: TokenProb, ev: TokenEvent, stages: Sequence[StageSnapshot],
                  model: dict[int, float]) -> None:
        """One candidate token: its probability under the model and after each stage, or why it is missing."""
        chosen = p.token_id == ev.token_id
        name = QTableWidgetItem(("▶ " if chosen else "") + visible(p.text, p.token_bytes))
        font = QFont(self._mono)
        font.setBold(chosen)
        name.setFont(font)
        self.table.setItem(r, 0, name)
        cells = [model.get(p.token_id, ev.prob if chosen else None)]
        missing = ["·"]
        for s in stages:
            probs = {t.token_id: t.prob for t in s.top}
            cells.append(probs.get(p.token_id))
            missing.append(_missing(s, p.token_id))
        for c, (prob, miss) in enumerate(zip(cells, missing), start=1):
            item = QTableWidgetItem()
            item.setData(PROB_ROLE, prob)
            item.setData(MISSING_ROLE, miss)
            item.setData(CHOSEN_ROLE, chosen)
            if prob is None:
                item.setToolTip(self._missing_tip(ev, p, stages[c - 2] if c >= 2 else None, miss))
            self.table.setItem(r, c, item)

    @staticmethod
    def _missing_tip(ev: TokenEvent, p: TokenProb, stage: StageSnapshot | None, miss: str) -> str:
        """Why a token has no probability after `stage` (None: the model column): what removed it, or the
        banned phrase it began."""
        rw = ev.rewind
        began_phrase = rw is not None and rw.banned_token_id == p.token_id
        if miss == "banned" and stage is not None and stage.stage == BANNED_STAGE and rw is not None and began_phrase:
            return (f"banned {rw.phrase!r} here: this token began the phrase, so the answer stepped back "
                    f"({rw.withdrawn} tokens) and this token may not be picked at this position")
        removal = removed_by(ev, p.token_id) if miss in ("cut", "banned") else None
        return removal[1] if removal else _MISSING_TIPS[miss]

    def _fit_token_column(self) -> None:
        """The token column as wide as its longest token ("␣atmospheric", not "␣atmosphe…"), as far as the
        stage columns keep COLUMN_WIDTH each; never under TOKEN_WIDTH."""
        columns = self.table.columnCount()
        if columns == 0:
            return
        self.table.resizeColumnToContents(0)
        wanted = self.table.columnWidth(0)
        room = self.table.viewport().width() - COLUMN_WIDTH * (columns - 1)
        self.table.setColumnWidth(0, max(TOKEN_WIDTH, min(wanted, room)))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._fit_token_column()  # a wider dock gives the token column its words back


def _missing(s: StageSnapshot, token_id: int) -> str:
    """What a cell says for a candidate absent from stage `s`'s list."""
    if token_id in s.removed:  # the stage itself recorded that it removed this one
        return "banned" if s.stage in ("logit_bias", BANNED_STAGE) else "cut"
    return "cut" if s.survivors <= len(s.top) else "·"


def _candidates(ev: TokenEvent) -> list[TokenProb]:
    """The model's top tokens, then any a stage promoted from beyond them (penalties can), capped."""
    seen = {p.token_id for p in ev.top_model}
    rows = list(ev.top_model)
    for s in ev.stages or ():
        for t in s.top:
            if t.token_id not in seen:
                seen.add(t.token_id)
                rows.append(t)
    if ev.token_id not in seen:
        rows.append(TokenProb(ev.token_id, ev.token_text, ev.logprob, ev.token_bytes))
    chosen = [p for p in rows if p.token_id == ev.token_id]
    rest = [p for p in rows if p.token_id != ev.token_id][: MAX_ROWS - 1]
    return sorted(chosen + rest, key=lambda p: rows.index(p))



def _greedy(ev: TokenEvent) -> bool:
    """Whether the token was picked greedily (temperature 0), read from the event itself.

    The chain reports a greedy pick's final distribution as the argmax alone at log-prob 0. A draw
    reports the whole final distribution, which is one token only when a stage (recorded in
    `stages`) or the model itself left one: then the model's own list has no second token either.
    """
    top = ev.top_sampler
    if len(top) != 1 or top[0].logprob != 0.0:
        return False
    if ev.stages:
        return ev.stages[-1].survivors > 1  # the last stage left several tokens, yet one was certain
    return sum(1 for p in ev.top_model if p.logprob > float("-inf")) > 1


def _count(n: int) -> str:
    """Survivor counts in little room: 40, 1.2k, 49k."""
    if n < 1000:
        return str(n)
    return f"{n / 1000:.1f}k" if n < 10_000 else f"{n // 1000}k"
