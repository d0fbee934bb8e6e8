"""The logit-lens picture: layers (bottom: first, top: last) by answer tokens, coloured by the chosen token's probability.

Each column is one answer token, each cell how likely that token is if the
model stopped after that layer. Clicking a column selects its token.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.theme import is_dark
from app.widgets.heat import heat_color

CELL_H = 4  # px per layer
MIN_CELL_W = 6  # px per token


class LayerHeatmap(QWidget):
    index_clicked = Signal(int)  # answer token index

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._probs = np.zeros((0, 0), dtype=np.float32)  # (layers, tokens)
        self._indices: tuple[int, ...] = ()
        self._selected: int | None = None
        self._texts: tuple[str, ...] = ()  # token text per column, for the tooltip
        self.setAccessibleName("Layer heatmap")
        self.setToolTip("How likely each answer token is at every layer (bottom: first layer, top: last). "
                        "Click a column to look at that token")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMouseTracking(True)

    # -- data ---------------------------------------------------------------------------

    def set_data(self, probs: np.ndarray, indices: tuple[int, ...], texts: tuple[str, ...] = ()) -> None:
        self._probs, self._indices, self._texts = np.asarray(probs, dtype=np.float32), tuple(indices), tuple(texts)
        self.updateGeometry()
        self.update()

    def clear(self) -> None:
        self.set_data(np.zeros((0, 0), dtype=np.float32), ())

    def set_selected(self, index: int | None) -> None:
        self._selected = index
        self.update()

    @property
    def indices(self) -> tuple[int, ...]:
        return self._indices

    def complete(self) -> bool:
        """Every column is read (none still NaN)."""
        return bool(self._indices) and bool(np.isfinite(self._probs).all())

    def value(self, layer: int, index: int) -> float:
        """The probability drawn for answer token `index` at `layer` (NaN while its column is being read)."""
        return float(self._probs[layer, self._indices.index(index)])

    # -- geometry -----------------------------------------------------------------------

    def sizeHint(self) -> QSize:
        return QSize(MIN_CELL_W * max(1, len(self._indices)), CELL_H * max(1, self._probs.shape[0]) + 2)

    def minimumSizeHint(self) -> QSize:
        return QSize(60, self.sizeHint().height())

    def _cell_w(self) -> float:
        return self.width() / max(1, len(self._indices))

    def column_rect(self, index: int) -> QRectF:
        """Where answer token `index` is drawn (for clicks and tests)."""
        col = self._indices.index(index)
        return QRectF(col * self._cell_w(), 0, self._cell_w(), self.height())

    def _column_at(self, x: float) -> int | None:
        if not self._indices:
            return None
        col = int(x // self._cell_w())
        return self._indices[col] if 0 <= col < len(self._indices) else None

    # -- drawing and clicks -------------------------------------------------------------

    def paintEvent(self, _event: QPaintEvent) -> None:
        layers, cols = self._probs.shape
        if not layers or not cols:
            return
        p = QPainter(self)
        dark = is_dark(self.palette())
        w, h = self._cell_w(), (self.height() - 2) / layers
        for layer in range(layers):
            y = (layers - 1 - layer) * h + 1  # the last layer on top
            for col in range(cols):
                value = float(self._probs[layer, col])
                if np.isfinite(value):  # NaN: a column still being read
                    p.fillRect(QRectF(col * w, y, w + 0.5, h + 0.5), heat_color(value, dark))
        if self._selected in self._indices:
            p.setPen(QPen(self.palette().text().color(), 2))
            p.setBrush(QColor(0, 0, 0, 0))
            p.drawRect(self.column_rect(self._selected).adjusted(1, 1, -1, -1))
        p.end()

    def mousePressEvent(self, event: QMouseEvent) -> None:
        index = self._column_at(event.position().x())
        if index is not None and event.button() == Qt.MouseButton.LeftButton:
            self.index_clicked.emit(index)
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        index = self._column_at(event.position().x())
        if index is not None and self._probs.size:
            col = self._indices.index(index)
            text = self._texts[col] if col < len(self._texts) else ""
            layers = self._probs.shape[0]
            layer = layers - 1 - int(event.position().y() // max(1e-6, (self.height() - 2) / layers))
            layer = max(0, min(layers - 1, layer))
            value = self._probs[layer, col]
            shown = f"{100 * value:.1f}%" if np.isfinite(value) else "not read yet"
            self.setToolTip(f"token {index + 1} {text}: {shown} at layer {layer}")
        super().mouseMoveEvent(event)
