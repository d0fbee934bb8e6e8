"""`python -m app.tools.compare_screenshot [--model M] [--size WxH] OUT_DIR`: the Compare screenshot of the README.

A new chat, the Balanced preset with seed 7, and Chat ▸ Compare on the
prompt below with two columns that differ in top-p only (0.95 and 0.5), the
same seed in both; the token where they first part is selected so its
alternatives show under the columns. The Compare window is saved as
`compare.png`. Runs in a temporary data dir, with a fixed seed so retakes
look alike.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the window's module is imported late (it pulls in the whole UI)
    from app.main_window import MainWindow

log = logging.getLogger(__name__)

PROMPT = "Write one sentence about a lighthouse at night."
SIZE = (1440, 900)


async def take_compare_screenshot(window: MainWindow, out_dir: str | Path, size: tuple[int, int] = SIZE) -> Path:
    from app.tools.screenshots import _save, _settle, ready_window
    from app.widgets.experiment_windows.compare_view import CompareView

    out = await ready_window(window, out_dir, size)
    window.settings.apply_preset("Balanced")
    window.settings.update_sampler(seed=7)
    window.library.new()
    view = CompareView(window.library, window.settings, window.host, parent=window)
    try:
        view.prompt.setPlainText(PROMPT)
        view.max_tokens.setValue(48)
        editor = view.columns[1].editor
        if editor is None:  # every column Compare adds has one
            raise RuntimeError("Compare's second column has no settings to change")
        editor.set_value("top_p", 0.5)
        view.resize(*size)
        view.show()
        task = view.run()
        if task is None:
            raise RuntimeError(f"Compare did not start: {view.status.text()}")
        await task
        await _settle(0.8)
        first = view.divergence
        view._on_token_clicked(view.columns[1], first if first is not None else 0)  # as a click on it does
        await _settle(0.8)
        path = out / "compare.png"
        _save(view, path)
    finally:
        view.close()
    return path


def run(argv: list[str] | None = None) -> int:
    from app.tools.shot_runner import run_shot

    return run_shot(argv, "python -m app.tools.compare_screenshot", take_compare_screenshot)


if __name__ == "__main__":
    sys.exit(run())
