"""Where the selected position looks: its attention over the prompt and the answer, drawn as highlights.

One layer (or all layers averaged) and one head (or all heads averaged) at a
time; each earlier token's background is as strong as its share of the
attention, relative to the most attended token, so the few tokens that
matter stand out whatever the layer's spread.
"""

from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QTextBrowser, QVBoxLayout, QWidget

from app.widgets.fmt import pct

ALL = -1  # combo data: every layer / head averaged
HIGHLIGHT = (255, 170, 0)  # amber, readable over light and dark text alike at the alphas used


class AttentionView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._attention = np.zeros((0, 0, 0), dtype=np.float32)  # (layers, heads, positions)
        self._texts: tuple[str, ...] = ()
        self._answer_start = 0
        self.layer_box = QComboBox()
        self.layer_box.setAccessibleName("Attention layer")
        self.head_box = QComboBox()
        self.head_box.setAccessibleName("Attention head")
        self.layer_box.currentIndexChanged.connect(lambda _i: self._redraw())
        self.head_box.currentIndexChanged.connect(lambda _i: self._redraw())
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setAccessibleName("Most attended tokens")
        self.summary.setTextFormat(Qt.TextFormat.RichText)  # the tokens' text and the numbers are escaped
        self.text = QTextBrowser()
        self.text.setOpenLinks(False)
        self.text.setAccessibleName("Attention over the prompt and answer")
        pickers = QHBoxLayout()
        pickers.addWidget(QLabel("Attention:"))
        pickers.addWidget(self.layer_box, 1)
        pickers.addWidget(self.head_box, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(pickers)
        lay.addWidget(self.summary)
        lay.addWidget(self.text, 1)

    def set_attention(self, attention: np.ndarray | None, texts: tuple[str, ...], answer_start: int) -> None:
        """`attention` (layers, heads, positions) of one query over the tokens `texts` (prompt, then answer)."""
        self._attention = np.zeros((0, 0, 0), dtype=np.float32) if attention is None else np.asarray(attention)
        self._texts, self._answer_start = texts, answer_start
        layers, heads = self._attention.shape[:2]
        for box, n, all_label, one in ((self.layer_box, layers, "all layers (mean)", "layer"),
                                       (self.head_box, heads, "heads averaged", "head")):
            keep = box.currentData()
            box.blockSignals(True)
            box.clear()
            box.addItem(all_label, ALL)
            for i in range(n):
                box.addItem(f"{one} {i}", i)
            found = box.findData(keep)
            box.setCurrentIndex(found if found >= 0 else 0)
            box.blockSignals(False)
        self._redraw()

    def weights(self) -> np.ndarray:
        """(positions,) the attention drawn now: the chosen layer and head, or their average."""
        if self._attention.size == 0:
            return np.zeros(0, dtype=np.float32)
        layer, head = self.layer_box.currentData(), self.head_box.currentData()
        a = self._attention if layer in (None, ALL) else self._attention[layer : layer + 1]
        a = a if head in (None, ALL) else a[:, head : head + 1]
        return a.mean(axis=(0, 1))

    def _redraw(self) -> None:
        w = self.weights()
        if w.size == 0:
            self.summary.setText("")
            self.text.setHtml("")
            return
        top = np.argsort(-w)[:3]
        self.summary.setText("Most attended: " + ", ".join(
            f"“{html.escape(self._texts[i])}” {html.escape(pct(float(w[i])))}" for i in top))
        peak = float(w.max()) or 1.0
        parts = []
        for i, text in enumerate(self._texts):
            if i == self._answer_start:
                parts.append("<br><b>answer:</b> ")
            alpha = min(1.0, float(w[i]) / peak)
            shown = html.escape(text).replace("\n", "↵<br>") or "∅"
            parts.append(f"<span style='background-color: rgba({HIGHLIGHT[0]},{HIGHLIGHT[1]},{HIGHLIGHT[2]},"
                         f"{alpha:.2f})' title='{html.escape(pct(float(w[i])))}'>{shown}</span>")
        self.text.setHtml("<div style='white-space: pre-wrap'>" + "".join(parts) + "</div>")
