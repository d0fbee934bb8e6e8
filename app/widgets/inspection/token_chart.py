"""Probability and entropy along a whole message; click a point to select that token.

Bars: each token's probability, coloured like the heatmap. Line: entropy of
the distribution it was drawn from. With more tokens than pixels, each pixel
column shows its least likely token (so surprises never vanish in the
downsampling) and the highest entropy. Binning is numpy, drawing is at most
one bar and one line point per pixel column, and while an answer streams
repaints are coalesced to `REPAINT_MS`: a 4,000-token answer costs the UI
thread about as much as a 40-token one.
"""

from __future__ import annotations

import numpy as np
from engine import TokenEvent
from PySide6.QtCore import QPointF, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QMouseEvent, QPainter, QPaintEvent, QPalette, QPen, QPolygonF
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from app.widgets.fmt import pct, visible
from app.widgets.heat import ENTROPY_MAX_NATS, heat_color

MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 34, 8, 16, 16
REPAINT_MS = 250
_LEVELS = 48  # colour steps for the bars


class TokenChart(QWidget):
    index_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Probability and entropy along the message")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(110)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        # paintEvent fills every pixel: without this each repaint also repainted the inspector behind it.
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)
        self._tokens: list[TokenEvent] = []
        self._probs: list[float] = []
        self._entropy: list[float] = []
        self._selected: int | None = None
        self._repaint = QTimer(self)
        self._repaint.setSingleShot(True)
        self._repaint.setInterval(REPAINT_MS)
        self._repaint.timeout.connect(self.update)
        self._palette_key: tuple[bool, ...] = ()
        self._colors: list[QColor] = []

    def sizeHint(self) -> QSize:
        return QSize(360, 120)

    @property
    def count(self) -> int:
        return len(self._tokens)

    def set_tokens(self, tokens: list[TokenEvent]) -> None:
        self._tokens = list(tokens)
        self._probs = [t.prob for t in self._tokens]
        self._entropy = [t.entropy for t in self._tokens]
        self.update()

    def append(self, tokens: list[TokenEvent]) -> None:
        self._tokens.extend(tokens)
        self._probs.extend(t.prob for t in tokens)
        self._entropy.extend(t.entropy for t in tokens)
        if not self._repaint.isActive():
            self._repaint.start()

    def set_selected(self, index: int | None) -> None:
        self._selected = index
        self.update()

    # -- geometry --------------------------------------------------------------------------

    def _plot(self) -> QRectF:
        return QRectF(MARGIN_L, MARGIN_T, self.width() - MARGIN_L - MARGIN_R, self.height() - MARGIN_T - MARGIN_B)

    def x_of(self, index: int) -> float:
        plot = self._plot()
        return plot.left() + (index + 0.5) * plot.width() / max(1, len(self._tokens))

    def index_at(self, x: float) -> int | None:
        plot = self._plot()
        if not self._tokens or not plot.left() <= x <= plot.right():
            return None
        i = int((x - plot.left()) / plot.width() * len(self._tokens))
        return max(0, min(len(self._tokens) - 1, i))

    # -- painting --------------------------------------------------------------------------

    def _bar_colors(self, dark: bool) -> list[QColor]:
        if self._palette_key != (dark,):
            self._palette_key = (dark,)
            self._colors = [heat_color(i / (_LEVELS - 1), dark) for i in range(_LEVELS)]
        return self._colors

    def paintEvent(self, _event: QPaintEvent) -> None:
        p = QPainter(self)
        pal = self.palette()
        dark = pal.color(QPalette.ColorRole.Window).lightness() < 128
        text = pal.color(QPalette.ColorRole.WindowText)
        dim = pal.color(QPalette.ColorRole.PlaceholderText)
        plot = self._plot()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Window))
        p.fillRect(plot, pal.color(QPalette.ColorRole.Base))
        grid = QColor(text)
        grid.setAlpha(30)
        p.setPen(QPen(grid, 1))
        fm = self.fontMetrics()
        for frac in (0.0, 0.5, 1.0):
            y = plot.bottom() - frac * plot.height()
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.setPen(dim)
        for frac, label in ((1.0, "1"), (0.5, ".5"), (0.0, "0")):
            y = plot.bottom() - frac * plot.height()
            p.drawText(QRectF(0, y - fm.height() / 2, MARGIN_L - 6, fm.height()), Qt.AlignmentFlag.AlignRight, label)
        p.drawText(QRectF(plot.left(), 0, plot.width(), MARGIN_T), Qt.AlignmentFlag.AlignLeft, "p(token)")
        p.drawText(
            QRectF(plot.left(), 0, plot.width(), MARGIN_T), Qt.AlignmentFlag.AlignRight, f"— entropy (0–{ENTROPY_MAX_NATS:.0f} nats)"
        )
        n = len(self._probs)
        if not n:
            p.drawText(plot, Qt.AlignmentFlag.AlignCenter, "no tokens yet")
            return
        probs = np.asarray(self._probs)
        ent = np.asarray(self._entropy)
        bins = max(1, min(n, int(plot.width())))
        starts = (np.arange(bins) * n) // bins  # (bins,) first token of each pixel column
        low = np.minimum.reduceat(probs, starts)  # the least likely token per column
        high_h = np.maximum.reduceat(ent, starts)
        width = plot.width() / bins
        colors = self._bar_colors(dark)
        levels = np.clip((low * (_LEVELS - 1)).round().astype(int), 0, _LEVELS - 1)
        heights = np.maximum(1.0, low * plot.height())
        gap = 1.0 if width > 3 else 0.0
        for c in range(bins):
            p.fillRect(
                QRectF(plot.left() + c * width, plot.bottom() - heights[c], max(1.0, width - gap), heights[c]),
                colors[levels[c]],
            )
        xs = plot.left() + (np.arange(bins) + 0.5) * width
        ys = plot.bottom() - np.minimum(high_h / ENTROPY_MAX_NATS, 1.0) * plot.height()
        line = QColor(text)
        line.setAlpha(170)
        p.setPen(QPen(line, 1))
        p.drawPolyline(QPolygonF([QPointF(x, y) for x, y in zip(xs.tolist(), ys.tolist())]))
        if self._selected is not None and 0 <= self._selected < n:
            x = self.x_of(self._selected)
            p.setPen(QPen(pal.color(QPalette.ColorRole.Highlight), 2))
            p.drawLine(QPointF(x, plot.top()), QPointF(x, plot.bottom()))
        p.setPen(dim)
        p.drawText(QRectF(plot.left(), plot.bottom() + 1, plot.width(), MARGIN_B), Qt.AlignmentFlag.AlignRight, f"{n} tokens")

    # -- interaction -----------------------------------------------------------------------

    def mousePressEvent(self, event: QMouseEvent) -> None:
        i = self.index_at(event.position().x())
        if i is not None and event.button() == Qt.MouseButton.LeftButton:
            self.index_clicked.emit(i)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        i = self.index_at(event.position().x())
        if i is None:
            QToolTip.hideText()
            return
        ev = self._tokens[i]
        QToolTip.showText(
            event.globalPosition().toPoint(),
            f"#{i + 1} {visible(ev.token_text, ev.token_bytes)} · p {pct(ev.prob)} · H {ev.entropy:.2f}",
            self,
        )
