"""The one QApplication of a Logit Lab process, set up as the app, its self-test and its tools all need it."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication

from app import __version__
from app.qt_compat import guard_none_refcount
from app.ui_thread_gc import UiThreadGarbageCollector


def application() -> QApplication:
    """The process's QApplication (made here unless one exists), named as the app and collecting garbage on
    its own thread (app/ui_thread_gc.py). Quitting is left to the caller: after the window has written its
    last tokens, not when the last window closes."""
    guard_none_refcount()  # before Qt draws anything: see app/qt_compat.py
    existing = QApplication.instance()  # a plain QCoreApplication there makes QApplication() say so
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv[:1])
    app.setApplicationName("Logit Lab")
    app.setApplicationDisplayName("Logit Lab")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("logitlab")
    app.setQuitOnLastWindowClosed(False)
    if app.findChild(UiThreadGarbageCollector) is None:  # once per process, whoever calls this again
        UiThreadGarbageCollector(app)
    return app
