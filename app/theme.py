"""Light and dark palettes: follow the system, or force one (screenshots, user preference).

Qt 6.5+ reports the system scheme through `QStyleHints.colorScheme()` and
announces changes with `colorSchemeChanged`. Fusion is used off macOS so an
explicit palette looks the same everywhere (platform styles may ignore it).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette
from PySide6.QtWidgets import QApplication

log = logging.getLogger(__name__)

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
SCHEMES = ("system", "light", "dark")

_DARK = {
    QPalette.ColorRole.Window: "#1e1f22",
    QPalette.ColorRole.WindowText: "#e4e4e7",
    # Fields a step lighter than the window, so inputs and check boxes stand out (Fusion draws
    # their frames from these colours).
    QPalette.ColorRole.Base: "#2a2c31",
    QPalette.ColorRole.AlternateBase: "#2e3035",
    QPalette.ColorRole.ToolTipBase: "#2b2d31",
    QPalette.ColorRole.ToolTipText: "#e4e4e7",
    QPalette.ColorRole.PlaceholderText: "#8a8c93",
    QPalette.ColorRole.Text: "#e4e4e7",
    QPalette.ColorRole.Button: "#33353b",
    QPalette.ColorRole.ButtonText: "#e4e4e7",
    QPalette.ColorRole.BrightText: "#ff6b6b",
    QPalette.ColorRole.Light: "#4a4c53",
    QPalette.ColorRole.Midlight: "#3c3e44",
    QPalette.ColorRole.Mid: "#55575e",
    QPalette.ColorRole.Dark: "#141517",
    QPalette.ColorRole.Shadow: "#000000",
    QPalette.ColorRole.Highlight: "#3b74d1",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#7aa7ff",
    QPalette.ColorRole.LinkVisited: "#b391ff",
}
_LIGHT = {
    QPalette.ColorRole.Window: "#f3f3f5",
    QPalette.ColorRole.WindowText: "#1d1d21",
    QPalette.ColorRole.Base: "#ffffff",
    QPalette.ColorRole.AlternateBase: "#eef0f4",
    QPalette.ColorRole.ToolTipBase: "#ffffff",
    QPalette.ColorRole.ToolTipText: "#1d1d21",
    QPalette.ColorRole.PlaceholderText: "#85878e",
    QPalette.ColorRole.Text: "#1d1d21",
    QPalette.ColorRole.Button: "#e9e9ec",
    QPalette.ColorRole.ButtonText: "#1d1d21",
    QPalette.ColorRole.BrightText: "#d62828",
    QPalette.ColorRole.Light: "#ffffff",
    QPalette.ColorRole.Midlight: "#f0f0f2",
    QPalette.ColorRole.Mid: "#b9bac0",
    QPalette.ColorRole.Dark: "#8f9096",
    QPalette.ColorRole.Shadow: "#3c3c40",
    QPalette.ColorRole.Highlight: "#2f6fd6",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#1f5fc4",
    QPalette.ColorRole.LinkVisited: "#6b3fc4",
}


def _palette(colors: dict[QPalette.ColorRole, str]) -> QPalette:
    pal = QPalette()
    for role, hexcolor in colors.items():
        pal.setColor(role, QColor(hexcolor))
    disabled = QColor(colors[QPalette.ColorRole.PlaceholderText])
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return pal


def is_dark(palette: QPalette | None = None) -> bool:
    """Whether text is drawn light on dark (decides the heatmap colours)."""
    pal = palette or QGuiApplication.palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


def app_icon() -> QIcon:
    return QIcon(str(RESOURCES / "logitlab.svg"))


class Theme(QObject):
    """Applies a scheme to the application and re-applies it when the system scheme changes."""

    changed = Signal(bool)  # dark?

    def __init__(self, app: QApplication, scheme: str = "system"):
        super().__init__(app)
        self._app = app
        self.scheme = "system"
        if sys.platform != "darwin":
            app.setStyle("Fusion")
        app.styleHints().colorSchemeChanged.connect(self._on_system_scheme_changed)
        self.set_scheme(scheme)

    def system_is_dark(self) -> bool:
        return self._app.styleHints().colorScheme() == Qt.ColorScheme.Dark

    @property
    def dark(self) -> bool:
        return self.scheme == "dark" or (self.scheme == "system" and self.system_is_dark())

    def set_scheme(self, scheme: str) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown colour scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        self.scheme = scheme
        self._apply()

    def _apply(self) -> None:
        dark = self.dark
        self._app.setPalette(_palette(_DARK if dark else _LIGHT))
        self.changed.emit(dark)

    def _on_system_scheme_changed(self, _scheme: Qt.ColorScheme) -> None:
        if self.scheme == "system":
            self._apply()
