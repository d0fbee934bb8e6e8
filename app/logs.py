"""Where the app's log goes: a rotating file in the platform's log folder, plus the terminal when there is one.

A double-clicked app has no terminal, so its messages and crashes must land
in a file the user can find: Help ▸ Show log file calls `show_log_file`.

    Linux    ~/.local/state/logitlab/log/logitlab.log
    macOS    ~/Library/Logs/logitlab/logitlab.log
    Windows  %LOCALAPPDATA%\\logitlab\\Logs\\logitlab.log

`$LOGITLAB_LOG_DIR` overrides the folder (tests, portable installs).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import platformdirs

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget

LOG_DIR_ENV = "LOGITLAB_LOG_DIR"
LOG_NAME = "logitlab.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"
MAX_BYTES = 2 * 1024 * 1024  # per file; with 3 backups at most 8 MiB of logs
BACKUPS = 3

log = logging.getLogger(__name__)
_file_handler: logging.Handler | None = None


def log_dir() -> Path:
    """The log folder (not created): `$LOGITLAB_LOG_DIR`, else the platform's user log dir."""
    override = os.environ.get(LOG_DIR_ENV)
    return Path(override) if override else Path(platformdirs.user_log_dir("logitlab", appauthor=False))


def log_file() -> Path:
    """The current log file's path (it exists once `setup_logging` has run)."""
    return log_dir() / LOG_NAME


def ensure_std_streams() -> None:
    """Give a windowed app (no console: sys.stdout/stderr are None) streams that swallow output.

    Libraries write progress bars and warnings to sys.stderr without checking it
    (tqdm in transformers and huggingface_hub); with None they crash the load.
    """
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 - lives as long as the process


def setup_logging(verbose: bool = False) -> Path | None:
    """Log to the rotating file (and to stderr when it is a terminal or a pipe); returns the file or None.

    Also routes `warnings` and uncaught exceptions (main and worker threads) into
    the log, so a crash of a windowed app leaves its traceback in the file.
    Calling it again only changes the level.
    """
    global _file_handler
    ensure_std_streams()
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if _file_handler is not None:
        return log_file()
    formatter = logging.Formatter(FORMAT)
    if sys.stderr is not None and not _is_devnull(sys.stderr):
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(formatter)
        root.addHandler(console)
    path = log_file()
    written: Path | None = path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    except OSError as e:  # read-only home, full disk: run without a file rather than not at all
        log.warning("cannot write the log file %s: %s", path, e)
        written = None
    else:
        handler.setFormatter(formatter)
        root.addHandler(handler)
        _file_handler = handler
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    return written


def _is_devnull(stream: object) -> bool:
    return getattr(stream, "name", None) == os.devnull


def _log_uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("app").critical("uncaught exception", exc_info=(kind, value, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    if args.exc_value is None:  # threading allows a type without a value; logging's exc_info needs the exception
        logging.getLogger("app").critical("uncaught %s in thread %s", args.exc_type.__name__, name)
        return
    logging.getLogger("app").critical(
        "uncaught exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
    )


def show_log_file(parent: QWidget | None = None) -> None:
    """Help ▸ Show log file: open the log folder in the file manager, or show its path if that fails."""
    from PySide6.QtCore import Qt, QUrl
    from PySide6.QtGui import QDesktopServices
    from PySide6.QtWidgets import QMessageBox

    folder = log_dir()
    folder.mkdir(parents=True, exist_ok=True)
    if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
        box = QMessageBox(QMessageBox.Icon.Information, "Log file", f"The log is written to:\n\n{log_file()}", parent=parent)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # so the path can be copied
        box.open()
