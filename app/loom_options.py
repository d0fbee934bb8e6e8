"""The Loom panel's numbers (N, tokens, entropy, min-p, depth, budget, mode) kept across restarts.

The budget went back to 512 at every start. The panel's own spin boxes and
mode box are read when they change and set again when the window opens; a
stored value outside a box's range is clamped by the box, a wrong type is
ignored (that box keeps its default).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from PySide6.QtWidgets import QSpinBox

from app.state.database.store import Store

log = logging.getLogger(__name__)

LOOM_OPTIONS_KEY = "loom_options"
_SPINS = ("n_spin", "tokens_spin", "entropy_spin", "min_p_spin", "depth_spin", "budget_spin")


def remember_loom_options(view: Any, store: Store) -> None:
    """Set `view`'s (a LoomView's) boxes from the store, then save them whenever one changes."""
    saved = store.get_setting(LOOM_OPTIONS_KEY) or {}
    if not isinstance(saved, dict):
        saved = {}
    for name in _SPINS:
        box = getattr(view, name)
        value = saved.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            box.setValue(int(value) if isinstance(box, QSpinBox) else float(value))
    mode = saved.get("mode")
    index = view.mode.findData(mode) if isinstance(mode, str) else -1
    if index >= 0:
        view.mode.setCurrentIndex(index)

    def save(*_args: object) -> None:
        values: dict[str, Any] = {name: getattr(view, name).value() for name in _SPINS}
        values["mode"] = view.mode.currentData()
        try:
            store.put_setting(LOOM_OPTIONS_KEY, values)
        except sqlite3.Error as e:  # the panel works on; the numbers are not remembered this time
            log.warning("could not save the loom's settings: %s", e)

    for name in _SPINS:
        getattr(view, name).valueChanged.connect(save)
    view.mode.currentIndexChanged.connect(save)
