"""Where the answer looked: the attached documents' passages highlighted by the selected token's attention.

Fed with the layer view's own capture of the token (app/widgets/inspection/passage_jobs.py): the masses are summed
here, over heads and the layers picked, so changing the layers runs nothing on the model. Each passage is a block as
strong as its share of the attention that fell on passages, relative to the most attended one; the summary
names the three it looked at most. "Whole answer" asks for every answer token's attention (the model runs
again, engine.documents.whole_answer) and draws one bar per passage: where the answer as a whole looked.
The caveat is always shown with it: attention is where the model looked, not proof of what it used.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QTextBrowser, QVBoxLayout, QWidget

from engine import documents

from app.widgets.inspection.passage_jobs import PassageView
from app.widgets.fmt import pct

HIGHLIGHT = (255, 170, 0)  # the attention view's amber
LATE, ALL = "late", "all"  # layer picker data
SHOWN_CHARS = 600  # a passage's text shown at most (a long table run is cut, its share is not)
BAR_PX = 110  # the whole answer's bar for the most attended passage


class PassagePanel(QWidget):
    whole_answer_requested = Signal()  # "Whole answer" clicked: the owner computes it and calls set_answer

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._view: PassageView | None = None
        self._answer: documents.AnswerAttention | None = None
        self.whole_button = QPushButton("Whole answer")
        self.whole_button.setToolTip("Where the whole answer looked: every answer token's attention on the passages, "
                                     "averaged (the model reads the answer again)")
        self.whole_button.setEnabled(False)
        self.whole_button.clicked.connect(self._ask_whole_answer)
        self.answer_bar = QLabel()
        self.answer_bar.setTextFormat(Qt.TextFormat.RichText)  # passage labels are escaped
        self.answer_bar.setWordWrap(True)
        self.answer_bar.setAccessibleName("Where the whole answer looked")
        self.answer_bar.hide()
        self.layer_box = QComboBox()
        self.layer_box.setAccessibleName("Layers summed for the passages")
        # The later half first: on small models the early layers attend by position (the prompt's start).
        self.layer_box.addItem("later half of the layers", LATE)
        self.layer_box.addItem("all layers", ALL)
        self.layer_box.currentIndexChanged.connect(lambda _i: self._redraw())
        # Narrower than its longest item: the picker and Whole answer fit a 1024-pixel window's Inspector.
        self.layer_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.layer_box.setMinimumContentsLength(6)
        self.caveat = QLabel(documents.CAVEAT[0].upper() + documents.CAVEAT[1:] + ".")
        self.caveat.setWordWrap(True)
        self.caveat.setAccessibleName("What attention means")
        self.caveat.setStyleSheet("font-style: italic")
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)  # passage labels are escaped
        self.summary.setAccessibleName("Passages looked at most")
        self.text = QTextBrowser()
        self.text.setOpenLinks(False)
        self.text.setAccessibleName("Attached passages by attention")
        pickers = QHBoxLayout()
        pickers.addWidget(QLabel("Where it looked:"))
        pickers.addWidget(self.layer_box, 1)
        pickers.addWidget(self.whole_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(pickers)
        lay.addWidget(self.caveat)
        lay.addWidget(self.summary)
        lay.addWidget(self.answer_bar)
        lay.addWidget(self.text, 1)

    def set_view(self, view: PassageView | None) -> None:
        """The passages of the selected token, or None (no attached file in its prompt). The whole answer's bar
        stays while the token is another of the same answer (the owner clears it with `set_answer(None)`)."""
        self._view = view
        self.whole_button.setEnabled(view is not None)
        self._redraw()

    def set_answer(self, answer: documents.AnswerAttention | None, note: str = "") -> None:
        """The whole answer's attention (drawn as a bar per passage), or None with `note` (working, failed)."""
        self._answer = answer
        self.whole_button.setEnabled(self._view is not None)
        self.answer_bar.setVisible(answer is not None or bool(note))
        if answer is None:
            self.answer_bar.setText(html.escape(note))
        self._redraw()

    def _ask_whole_answer(self) -> None:
        self.set_answer(None, "Reading the whole answer's attention…")
        self.whole_button.setEnabled(False)  # until the answer (or why not) is set
        self.whole_answer_requested.emit()

    def _layers(self, n_layers: int) -> tuple[int, ...] | None:
        return documents.late_layers(n_layers) if self.layer_box.currentData() == LATE else None

    def answer_shares(self) -> tuple[float, ...]:
        """The whole answer's share per passage, over the layers picked now; () before it was asked for."""
        if self._answer is None:
            return ()
        return self._answer.share(self._layers(self._answer.layer_mass.shape[1]))

    def shares(self) -> tuple[float, ...]:
        """Each passage's share of the attention on passages, over the layers picked now."""
        if self._view is None:
            return ()
        mass, _used = documents.passage_mass(self._view.attention, self._view.passages,
                                             self._layers(self._view.attention.shape[0]))
        total = sum(mass)
        return tuple(m / total if total > 0 else 0.0 for m in mass)

    def _redraw(self) -> None:
        if self._view is None:
            self.summary.setText("No attached file in this answer's prompt.")
            self.text.setHtml("")
            return
        shares = self.shares()
        passages = self._view.passages
        top = sorted(range(len(passages)), key=lambda i: -shares[i])[:3]
        self.summary.setText(f"Token {self._view.index + 1} looked mostly at " + ", ".join(
            f"<b>{html.escape(passages[i].label)}</b> {html.escape(pct(shares[i]))}" for i in top))
        peak = max(shares, default=0.0) or 1.0
        parts = []
        for p, share in zip(passages, shares):
            alpha = min(1.0, share / peak)
            shown = p.text if len(p.text) <= SHOWN_CHARS else p.text[:SHOWN_CHARS] + " …"
            parts.append(
                f"<p style='background-color: rgba({HIGHLIGHT[0]},{HIGHLIGHT[1]},{HIGHLIGHT[2]},{alpha:.2f})'>"
                f"<b>{html.escape(p.label)} · {html.escape(pct(share))}</b><br>"
                f"{html.escape(shown).replace(chr(10), '<br>')}</p>")
        self.text.setHtml("".join(parts))
        self._draw_answer_bar()

    def _draw_answer_bar(self) -> None:
        answer = self._answer
        if answer is None:
            return
        shares = self.answer_shares()
        peak = max(shares, default=0.0) or 1.0
        read = (f"{len(answer.positions)} of its {answer.answer_tokens} tokens, evenly spaced"
                if len(answer.positions) < answer.answer_tokens else f"all {answer.answer_tokens} tokens")
        rows = "".join(
            f"<tr><td>{html.escape(p.label)}</td><td><table cellspacing=0 cellpadding=0><tr>"
            f"<td width={max(1, round(BAR_PX * share / peak))} height=10 "
            f"bgcolor='#{HIGHLIGHT[0]:02x}{HIGHLIGHT[1]:02x}{HIGHLIGHT[2]:02x}'></td></tr></table></td>"
            f"<td align=right>{html.escape(pct(share))}</td></tr>"
            for p, share in sorted(zip(answer.passages, shares), key=lambda ps: -ps[1]))
        self.answer_bar.setText(f"The whole answer ({read}) looked at:<table cellspacing=2>{rows}</table>")
