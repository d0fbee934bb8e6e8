"""Where converted and downloaded models live: the platform's user cache dir."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """`$LOGITLAB_CACHE_DIR` if set (tests point it at a temp dir), else the user cache dir."""
    override = os.environ.get("LOGITLAB_CACHE_DIR")
    root = Path(override) if override else Path(platformdirs.user_cache_dir("logitlab", appauthor=False))
    root.mkdir(parents=True, exist_ok=True)
    return root
