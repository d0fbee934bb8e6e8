"""Where the app keeps its data: `$LOGITLAB_DATA_DIR`, else the platform's user data dir."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DATA_DIR_ENV = "LOGITLAB_DATA_DIR"
DB_NAME = "logitlab.sqlite3"


def data_dir() -> Path:
    """The folder for the database (created if missing); tests and screenshots point the env var at a temp dir."""
    override = os.environ.get(DATA_DIR_ENV)
    root = Path(override) if override else Path(platformdirs.user_data_dir("logitlab", appauthor=False))
    root.mkdir(parents=True, exist_ok=True)
    return root


def database_path() -> Path:
    return data_dir() / DB_NAME
