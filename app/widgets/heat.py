"""Token colouring: probability, surprisal, entropy or steering effect mapped to a background colour, and its legend."""

from __future__ import annotations

import math

from engine import TokenEvent
from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QLinearGradient, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

SURPRISAL_MAX_BITS = 10.0  # -log2 p beyond this is "very surprising" (p < 0.1 %)
ENTROPY_MAX_NATS = 4.0  # a spread over ~55 equally likely tokens
# KL(steered ‖ unsteered) on a log scale: a light touch (0.02 nats) already shows, 2 nats and more is all red.
STEERING_KNEE_NATS = 0.02
STEERING_MAX_NATS = 2.0
# Two models on one text (app/widgets/experiment_windows/model_diff_view.py): KL per token on a log scale, from rounding-level
# agreement (a Q4 model against its float original: ~1e-3) to a different model (1 nat and more).
DIVERGENCE_RANGE_NATS = (1e-4, 1.0)

MODE_LABELS = {
    "probability": "Probability",
    "surprisal": "Surprisal",
    "entropy": "Entropy",
    "steering": "Steering effect",
    "divergence": "Divergence between two models",
}


def confidence(ev: TokenEvent, mode: str, steering_kl: float | None = None) -> float | None:
    """0 = alarming (unlikely / surprising / uncertain / much changed by steering), 1 = confident, for the colour
    scale; None (no colour) for the steering effect of a token it is not known for (an unsteered answer)."""
    if mode == "probability":
        return ev.prob
    if mode == "surprisal":
        bits = -ev.logprob / math.log(2) if math.isfinite(ev.logprob) else SURPRISAL_MAX_BITS
        return 1.0 - min(bits, SURPRISAL_MAX_BITS) / SURPRISAL_MAX_BITS
    if mode == "entropy":
        return 1.0 - min(ev.entropy, ENTROPY_MAX_NATS) / ENTROPY_MAX_NATS
    if mode == "steering":  # KL per token from the answer's unsteered shadow (app/controllers/steering_shadows.py)
        if steering_kl is None or not math.isfinite(steering_kl):
            return None
        scale = math.log1p(STEERING_MAX_NATS / STEERING_KNEE_NATS)
        return 1.0 - min(math.log1p(max(steering_kl, 0.0) / STEERING_KNEE_NATS) / scale, 1.0)
    if mode == "divergence":  # the KL (or |Δ log-prob| of a span) given per token, on a log scale
        if steering_kl is None or math.isnan(steering_kl):
            return None
        lo, hi = DIVERGENCE_RANGE_NATS
        return 1.0 - min(max(math.log(max(steering_kl, lo) / lo) / math.log(hi / lo), 0.0), 1.0)
    raise ValueError(f"unknown colouring {mode!r}")


def heat_color(value: float | None, dark: bool) -> QColor:
    """Red (0) through amber to green (1); translucent so text stays readable on either palette (None: none)."""
    if value is None:
        return QColor(0, 0, 0, 0)
    v = max(0.0, min(1.0, value))
    hue = v * 125.0 / 360.0
    if dark:
        return QColor.fromHslF(hue, 0.55, 0.36, 0.9)
    return QColor.fromHslF(hue, 0.85, 0.72, 0.75)


def legend_ends(mode: str) -> tuple[str, str]:
    """Labels for the left (value 0) and right (value 1) ends of the legend."""
    if mode == "probability":
        return "p 0", "1"
    if mode == "surprisal":
        return f"{SURPRISAL_MAX_BITS:.0f}+ bits", "0 bits"
    if mode == "steering":
        return f"KL {STEERING_MAX_NATS:g}+ nats", "0"
    if mode == "divergence":
        return f"{DIVERGENCE_RANGE_NATS[1]:g}+ nats", f"≤{DIVERGENCE_RANGE_NATS[0]:g}"
    return f"H {ENTROPY_MAX_NATS:.0f}+ nats", "0"


class HeatLegend(QWidget):
    """A gradient bar with its end labels, for the current colouring mode."""

    def __init__(self, mode: str = "probability", parent: QWidget | None = None):
        super().__init__(parent)
        self._mode = mode
        # Maximum: its size hint when there is room, narrower (down to nothing) when the chat's header has none,
        # so the legend never makes the window wider than a small screen.
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Heatmap legend")
        self._update_description()

    def set_mode(self, mode: str) -> None:
        self._mode = mode
        self._update_description()
        self.update()

    def _update_description(self) -> None:
        lo, hi = legend_ends(self._mode)
        self.setToolTip(f"{MODE_LABELS[self._mode]}: red = {lo}, green = {hi}")
        self.setAccessibleDescription(self.toolTip())

    def sizeHint(self) -> QSize:
        fm = self.fontMetrics()
        lo, hi = legend_ends(self._mode)
        return QSize(fm.horizontalAdvance(lo) + fm.horizontalAdvance(hi) + 130, fm.height() + 6)

    def minimumSizeHint(self) -> QSize:
        return QSize(0, self.sizeHint().height())

    def paintEvent(self, _event: QPaintEvent) -> None:
        fm = self.fontMetrics()
        lo, hi = legend_ends(self._mode)
        lw, hw = fm.horizontalAdvance(lo), fm.horizontalAdvance(hi)
        if self.width() < lw + hw + 40:  # squeezed by a narrow window: no legend rather than a broken one
            return
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        bar = QRectF(lw + 6, 3, self.width() - lw - hw - 12, self.height() - 6)
        dark = _is_dark(self.palette())
        grad = QLinearGradient(bar.topLeft(), bar.topRight())
        for i in range(11):
            grad.setColorAt(i / 10, heat_color(i / 10, dark))
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(grad)
        p.drawRoundedRect(bar, 3, 3)
        p.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        text_rect = self.rect()
        p.drawText(text_rect, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, lo)
        p.drawText(text_rect, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, hi)


def _is_dark(pal: QPalette) -> bool:
    return pal.color(QPalette.ColorRole.Window).lightness() < 128
