"""Where the answer looked: the attached documents' passages highlighted by the selected token's attention.

Fed with the layer view's own capture of the token (app/widgets/passage_jobs.py): the masses are summed
here, over heads and the layers picked, so changing the layers runs nothing on the model. Each passage is a block as
strong as its share of the attention that fell on passages, relative to the most attended one; the summary
names the three it looked at most. The caveat is always shown with it: attention is where the model looked,
not proof of what it used.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QTextBrowser, QVBoxLayout, QWidget

from engine import documents

from app.widgets.passage_jobs import PassageView
from app.widgets.fmt import pct

HIGHLIGHT = (255, 170, 0)  # the attention view's amber
LATE, ALL = "late", "all"  # layer picker data
SHOWN_CHARS = 600  # a passage's text shown at most (a long table run is cut, its share is not)


class PassagePanel(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._view: PassageView | None = None
        self.layer_box = QComboBox()
        self.layer_box.setAccessibleName("Layers summed for the passages")
        # The later half first: on small models the early layers attend by position (the prompt's start).
        self.layer_box.addItem("later half of the layers", LATE)
        self.layer_box.addItem("all layers", ALL)
        self.layer_box.currentIndexChanged.connect(lambda _i: self._redraw())
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
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(pickers)
        lay.addWidget(self.caveat)
        lay.addWidget(self.summary)
        lay.addWidget(self.text, 1)

    def set_view(self, view: PassageView | None) -> None:
        """The passages of the selected token, or None (no attached file in its prompt)."""
        self._view = view
        self._redraw()

    def shares(self) -> tuple[float, ...]:
        """Each passage's share of the attention on passages, over the layers picked now."""
        if self._view is None:
            return ()
        n_layers = self._view.attention.shape[0]
        layers = documents.late_layers(n_layers) if self.layer_box.currentData() == LATE else None
        mass, _used = documents.passage_mass(self._view.attention, self._view.passages, layers)
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
