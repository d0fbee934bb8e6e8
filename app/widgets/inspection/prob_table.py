"""The top-N alternatives of one token: probability under the model and after the sampler, side by side."""

from __future__ import annotations

import math

from engine import TokenEvent, TokenProb
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QKeyEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTreeWidget, QTreeWidgetItem, QWidget

from app.widgets.inspection.bars import CHOSEN_ROLE, MISSING_ROLE, PROB_ROLE, BarDelegate, SoftSelectionDelegate
from app.widgets.fmt import visible
from app.widgets.chat.constraint_marks import DISALLOWED_ROLE, disallowed_reason
from app.widgets.inspection.removal import removed_by

TOKEN_ID_ROLE = Qt.ItemDataRole.UserRole + 3


class ProbTable(QTreeWidget):
    """Rows: the model's top tokens (plus any the sampler kept beyond them); double-click = branch."""

    branch_requested = Signal(int)  # token id

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Alternatives")
        self.setColumnCount(3)
        self.setHeaderLabels(["Token", "Model", "Sampler"])
        self.setRootIsDecorated(False)
        self.setUniformRowHeights(True)
        self.setAlternatingRowColors(False)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setItemDelegateForColumn(0, SoftSelectionDelegate(self))
        self.setItemDelegateForColumn(1, BarDelegate(self))
        self.setItemDelegateForColumn(2, BarDelegate(self))
        header = self.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Fixed)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Fixed)
        self.setColumnWidth(1, 92)
        self.setColumnWidth(2, 92)
        # Not itemActivated: some platforms activate on a single click, and a click should only select.
        self.itemDoubleClicked.connect(self._on_activated)
        self._mono = QFont("monospace")
        self._mono.setStyleHint(QFont.StyleHint.Monospace)

    def show_token(self, ev: TokenEvent | None) -> None:
        self.clear()
        if ev is None:
            return
        model = {p.token_id: p for p in ev.top_model}
        sampler = {p.token_id: p for p in ev.top_sampler}
        # A server reports its top N only: the rest of the model's probability is one row, last.
        rest = [p for p in ev.top_model if p.is_rest]
        rows = [p for p in ev.top_model if not p.is_rest] + [p for p in ev.top_sampler if p.token_id not in model]
        if ev.token_id not in model and ev.token_id not in sampler:  # a forced token outside both lists
            rows.append(TokenProb(ev.token_id, ev.token_text, ev.logprob, ev.token_bytes))
        rows += rest
        # Missing from the sampler's list means "cut" only if the list holds every survivor.
        survivors = ev.stages[-1].survivors if ev.stages else None
        complete = survivors is not None and survivors <= len(ev.top_sampler)
        chosen_item = None
        for p in rows:
            if p.is_rest:
                self.addTopLevelItem(self._rest_item(p))
                continue
            chosen = p.token_id == ev.token_id
            item = QTreeWidgetItem([("▶ " if chosen else "") + visible(p.text, p.token_bytes), "", ""])
            item.setData(0, TOKEN_ID_ROLE, p.token_id)
            item.setData(1, PROB_ROLE, model[p.token_id].prob if p.token_id in model else (ev.prob if chosen else None))
            item.setData(1, MISSING_ROLE, "·")
            # The drawn token's own sampler probability is known even when it ranks below the sampler's top N
            # (the header says "p(sampler) 1.6%"; the cell said "·").
            drawn = chosen and math.isfinite(ev.sampler_logprob)
            item.setData(2, PROB_ROLE, sampler[p.token_id].prob if p.token_id in sampler
                         else (ev.sampler_prob if drawn else None))
            item.setData(2, MISSING_ROLE, "cut" if complete or (chosen and ev.forced) else "·")
            removal = removed_by(ev, p.token_id) if p.token_id not in sampler else None
            if removal is not None:  # which stage removed it ("cut: top-k"), or the banned string's step back
                item.setData(2, MISSING_ROLE, removal[0])
                item.setToolTip(2, removal[1])
            for col in range(3):
                item.setData(col, CHOSEN_ROLE, chosen)
            font = QFont(self._mono)
            font.setBold(chosen)
            item.setFont(0, font)
            item.setToolTip(0, f"token id {p.token_id}" + (" — the token chosen here" if chosen else " — double-click to branch with it"))
            if (why := disallowed_reason(ev, p.token_id)) is not None:  # greyed, and no branching with it
                item.setData(0, DISALLOWED_ROLE, why)
                item.setData(2, MISSING_ROLE, "not allowed")
                for col in range(3):
                    item.setForeground(col, self.palette().placeholderText())
                    item.setToolTip(col, f"token id {p.token_id} — {why}")
            self.addTopLevelItem(item)
            if chosen:
                chosen_item = item
        if chosen_item is not None:
            self.setCurrentItem(chosen_item)

    def _rest_item(self, rest: TokenProb) -> QTreeWidgetItem:
        """The probability of every token the server did not report: shown, never chosen or branched on."""
        item = QTreeWidgetItem([rest.text, "", ""])
        item.setData(0, TOKEN_ID_ROLE, rest.token_id)
        item.setData(1, PROB_ROLE, rest.prob)
        item.setData(1, MISSING_ROLE, "·")
        item.setData(2, PROB_ROLE, None)
        item.setData(2, MISSING_ROLE, "—")
        item.setFlags(Qt.ItemFlag.ItemIsEnabled)  # not selectable: there is no one token to branch with
        tip = (f"Every token the server did not report, together: {rest.prob:.1%} of the model's probability. "
               "The model column shows the server's own log-probs; the sampler drew from the reported tokens "
               "only, renormalised over them.")
        for col in range(3):
            item.setToolTip(col, tip)
        font = QFont(self._mono)
        font.setItalic(True)
        item.setFont(0, font)
        return item

    def selected_token(self) -> int | None:
        item = self.currentItem()
        return None if item is None else int(item.data(0, TOKEN_ID_ROLE))

    def select_token(self, token_id: int) -> bool:
        for i in range(self.topLevelItemCount()):
            item = self.topLevelItem(i)
            assert item is not None, "i is below topLevelItemCount, so the item exists"
            if int(item.data(0, TOKEN_ID_ROLE)) == token_id:
                self.setCurrentItem(item)
                return True
        return False

    def keyPressEvent(self, event: QKeyEvent) -> None:
        current = self.currentItem()
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and current is not None:
            self._on_activated(current)
            return
        super().keyPressEvent(event)

    def _on_activated(self, item: QTreeWidgetItem, _column: int = 0) -> None:
        token_id = int(item.data(0, TOKEN_ID_ROLE))
        if token_id >= 0 and item.data(0, DISALLOWED_ROLE) is None:  # "rest" stands for many; the constraint's refusals stay
            self.branch_requested.emit(token_id)
