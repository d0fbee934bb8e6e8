"""Links in a model's answer: opened only as http(s), only after the user has seen the full address.

A model writes whatever it likes: `javascript:`, `smb://`, `file:` or a bare path
handed to the OS or followed inside the view would run, mount or show things the
user never chose. Anything that is not http(s) with a host is not opened at all.
"""

from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMessageBox, QWidget

OPENABLE_SCHEMES = ("http", "https")


def openable(url: QUrl) -> bool:
    """Whether a link from a model may be offered to the browser: http(s) with a host, nothing else."""
    return url.isValid() and url.scheme().lower() in OPENABLE_SCHEMES and bool(url.host())


def describe(url: QUrl) -> str:
    """The full address as the browser would get it (encoded, so look-alike characters show)."""
    return url.toString(QUrl.ComponentFormattingOption.FullyEncoded)


def offer_to_open(parent: QWidget | None, url: QUrl) -> bool:
    """Ask before opening `url` in the browser; returns whether it was opened.

    Links that are not http(s) are refused without a question (the caller says so in its tooltip).
    """
    if not openable(url):
        return False
    address = describe(url)
    answer = QMessageBox.question(
        parent,
        "Open link",
        f"The answer links to:\n\n{address}\n\nThe model wrote this address. Open it in your browser?",
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        QMessageBox.StandardButton.No,
    )
    if answer != QMessageBox.StandardButton.Yes:
        return False
    return bool(QDesktopServices.openUrl(QUrl(address, QUrl.ParsingMode.StrictMode)))


def link_tooltip(url: QUrl) -> str:
    """What hovering a link says: the address, and whether a click can open it."""
    if openable(url):
        return f"{describe(url)}\n(click to open in your browser; you will be asked first)"
    return f"{url.toString()}\n(not opened: only http and https links from an answer open)"
