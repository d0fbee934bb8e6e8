"""`python -m app.tools.loom_screenshot [--model M] [--size WxH] OUT_DIR`: the loom screenshot of docs/loom.md.

The default model answers a question; the loom then makes 4 children with
their own seeds from the answer's fourth token and 3 beam-search children from
its second, and the Loom tab shows the tree with one of the beam children open
in the chat. Runs in a temporary data dir, at 1440x900, with a fixed seed so
retakes look alike.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the window's module is imported late (it pulls in the whole UI)
    from app.main_window import MainWindow

log = logging.getLogger(__name__)

QUESTION = "Write one sentence about the sea."
SIZE = (1440, 900)


async def take_loom_screenshot(window: MainWindow, out_dir: str | Path, size: tuple[int, int] = SIZE) -> Path:
    from app.tools.screenshots import _save, _settle, ready_window
    from app.widgets.experiment_windows.loom_view import NODE

    out = await ready_window(window, out_dir, size)
    window.settings.apply_preset("Balanced")
    window.settings.update_sampler(seed=11)
    window.settings.set_max_new_tokens(24)
    answer = await window.controller.send(QUESTION)
    assert answer is not None  # send() answers every non-empty prompt
    await window.loom.continuations(answer, 3, 4, "sample", 16)
    beams = await window.loom.continuations(answer, 1, 3, "beam", 12)
    window.view_options.set_heatmap(True)
    window.loom_dock.raise_()
    await _settle(0.8)
    view = window.loom_view
    view.mode.setCurrentIndex(view.mode.findData("beam"))
    node = next((n for n in (item.data(0, NODE) for item in view.items())
                 if n is not None and beams and beams[0].id in n.ends), None)
    if node is not None:
        view.open_node(node)
        view._select(node)
    await _settle(0.8)
    path = out / "loom.png"
    _save(window, path)
    return path


def run(argv: list[str] | None = None) -> int:
    from app.tools.shot_runner import run_shot

    return run_shot(argv, "python -m app.tools.loom_screenshot", take_loom_screenshot)


if __name__ == "__main__":
    sys.exit(run())
