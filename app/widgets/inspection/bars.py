"""Item delegates for the inspector's tables: probabilities drawn as bars, and a soft row selection.

The selection is painted translucent (not the solid highlight) so the bars
of the selected row, often the chosen token's, stay readable.
"""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

from app.widgets.fmt import pct

PROB_ROLE = Qt.ItemDataRole.UserRole + 1  # float in [0, 1], or None for "not in this list"
CHOSEN_ROLE = Qt.ItemDataRole.UserRole + 2  # bool: the row of the chosen token
MISSING_ROLE = Qt.ItemDataRole.UserRole + 4  # text shown when PROB_ROLE is None ("cut", "·")


def _soft_selection(painter: QPainter, option: QStyleOptionViewItem) -> None:
    if option.state & QStyle.StateFlag.State_Selected:
        tint = QColor(option.palette.color(QPalette.ColorRole.Highlight))
        tint.setAlpha(55)
        painter.fillRect(option.rect, tint)


class SoftSelectionDelegate(QStyledItemDelegate):
    """Plain text cells with the translucent selection."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> None:
        _soft_selection(painter, option)
        opt = QStyleOptionViewItem(option)
        opt.state &= ~QStyle.StateFlag.State_Selected
        opt.state &= ~QStyle.StateFlag.State_HasFocus
        super().paint(painter, opt, index)


class BarDelegate(QStyledItemDelegate):
    """Paints PROB_ROLE as a bar with its percentage; CHOSEN_ROLE rows in the accent colour."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> None:
        _soft_selection(painter, option)
        prob = index.data(PROB_ROLE)
        text_color = option.palette.color(QPalette.ColorRole.Text)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(option.rect).adjusted(3, 4, -3, -4)
        if prob is None:
            painter.setPen(option.palette.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(QRectF(option.rect), Qt.AlignmentFlag.AlignCenter, index.data(MISSING_ROLE) or "·")
            painter.restore()
            return
        chosen = bool(index.data(CHOSEN_ROLE))
        accent = QColor(option.palette.color(QPalette.ColorRole.Highlight))
        if not chosen:
            accent.setAlpha(110)
        track = QColor(text_color)
        track.setAlpha(20)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(track)
        painter.drawRoundedRect(r, 3, 3)
        if prob > 0:
            painter.setBrush(accent)
            painter.drawRoundedRect(QRectF(r.left(), r.top(), max(2.0, r.width() * min(1.0, float(prob))), r.height()), 3, 3)
        painter.setPen(text_color)
        font = painter.font()
        font.setBold(chosen)
        painter.setFont(font)
        # The number in the whole cell's height: the bar is inset, and in a short row its rect cut the text in half.
        text_rect = QRectF(option.rect).adjusted(7, 0, -7, 0)
        painter.drawText(text_rect, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, pct(prob))
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:  # noqa: N802 - Qt's name
        """At least the number's line height and a little air, whatever font the row's other cells use."""
        hint = super().sizeHint(option, index)
        return QSize(hint.width(), max(hint.height(), option.fontMetrics.height() + 4))
