"""The scroll areas the side docks put their panels in: one that scrolls sideways, one that scrolls down.

Each keeps its panel from making the window wider than a small screen: the sideways one keeps the panel's
width inside it (the dock keeps the window's), the downward one never shows a sideways bar.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, SignalInstance
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget

SIDE_PANEL_MIN_WIDTH = 270  # about the chats panel's own minimum
SIDE_PANEL_MAX_FLOOR = 300  # the sampling dock's floor follows its panel up to this; a wider panel scrolls sideways


def _scroll_area(widget: QWidget, name: str, accessible_name: str) -> QScrollArea:
    area = QScrollArea()
    area.setObjectName(name)
    area.setAccessibleName(accessible_name)
    area.setWidget(widget)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    return area


def sideways_scroll(panel: QWidget, min_width_changed: SignalInstance, name: str, accessible_name: str) -> QScrollArea:
    """`panel` (which scrolls down itself) scrolling sideways; the area's minimum width follows the panel's
    (`min_width_changed`) where it is modest (no sideways scrolling at 1024 px), never above the floor's cap."""
    area = _scroll_area(panel, name, accessible_name)
    area.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

    def follow_panel(width: int) -> None:
        area.setMinimumWidth(max(SIDE_PANEL_MIN_WIDTH, min(width, SIDE_PANEL_MAX_FLOOR)))

    follow_panel(panel.minimumWidth())
    min_width_changed.connect(follow_panel)
    return area


def downward_scroll(panel: QWidget, name: str, accessible_name: str) -> QScrollArea:
    """`panel`, whose rows grow, scrolling down and never widening."""
    area = _scroll_area(panel, name, accessible_name)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return area
