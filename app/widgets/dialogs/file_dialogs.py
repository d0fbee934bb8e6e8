"""File dialogs that start where the user was: the last folder used for that purpose, else the home folder.

Never the program's working folder (a packaged app's is "/" or its bundle). The
folder is remembered per purpose ("models", "exports") in the settings store,
so the next session starts there too.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.state.database.store import Store

LAST_FOLDERS_KEY = "last_folders"


def start_folder(store: Store, purpose: str) -> Path:
    """The last folder used for `purpose` while it still exists, else the user's home."""
    saved = store.get_setting(LAST_FOLDERS_KEY, {})
    folder = saved.get(purpose) if isinstance(saved, dict) else None
    if isinstance(folder, str) and Path(folder).is_dir():
        return Path(folder)
    return Path.home()


def remember_folder(store: Store, purpose: str, folder: Path) -> None:
    saved = store.get_setting(LAST_FOLDERS_KEY, {})
    saved = dict(saved) if isinstance(saved, dict) else {}
    saved[purpose] = str(folder)
    store.put_setting(LAST_FOLDERS_KEY, saved)


def save_file(parent: QWidget, store: Store, purpose: str, caption: str, name: str, filter_: str = "") -> Path | None:
    """Ask where to save `name`; None when cancelled."""
    chosen, _ = QFileDialog.getSaveFileName(parent, caption, str(start_folder(store, purpose) / name), filter_)
    if not chosen:
        return None
    remember_folder(store, purpose, Path(chosen).parent)
    return Path(chosen)


def open_file(parent: QWidget, store: Store, purpose: str, caption: str, filter_: str = "") -> Path | None:
    chosen, _ = QFileDialog.getOpenFileName(parent, caption, str(start_folder(store, purpose)), filter_)
    if not chosen:
        return None
    remember_folder(store, purpose, Path(chosen).parent)
    return Path(chosen)


def open_folder(parent: QWidget, store: Store, purpose: str, caption: str) -> Path | None:
    chosen = QFileDialog.getExistingDirectory(parent, caption, str(start_folder(store, purpose)))
    if not chosen:
        return None
    # A model folder is chosen from its parent: start there next time, not inside the last model.
    remember_folder(store, purpose, Path(chosen).parent)
    return Path(chosen)
