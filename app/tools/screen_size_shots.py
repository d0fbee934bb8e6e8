"""`python -m app.tools.screen_size_shots WIDTHxHEIGHT OUT.png`: the window as it opens on a screen of that size.

A first start on a screen of the given size (Qt's offscreen platform with one
screen, a temporary data dir), the default model, one answer with a token
selected in the inspector's stage view; the window is saved as a PNG. The docs'
`small-screen.png` (1024x700) and `window-1440x900.png` come from here:

    python -m app.tools.screen_size_shots 1024x700 docs/small-screen.png
    python -m app.tools.screen_size_shots 1440x900 docs/window-1440x900.png
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget

log = logging.getLogger(__name__)

PROMPT = "Why is the sky blue? Answer in a short paragraph."


def _use_screen(width: int, height: int) -> None:
    """Qt's offscreen platform with one screen of width x height (read when the QApplication starts)."""
    config = {"synchronousWindowSystemEvents": False, "windowFrameMargins": False,
              "screens": [{"name": "shot", "x": 0, "y": 0, "width": width, "height": height,
                           "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}
    folder = Path(tempfile.mkdtemp(prefix="logitlab-shot-"))
    (folder / "screen.json").write_text(json.dumps(config))
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={folder / 'screen.json'}"
    os.environ["LOGITLAB_DATA_DIR"] = str(folder / "data")


async def _settle(seconds: float = 0.6) -> None:
    from PySide6.QtWidgets import QApplication

    for _ in range(6):
        QApplication.processEvents()
        await asyncio.sleep(seconds / 6)


async def _shoot(out: Path) -> None:
    from app.lifecycle import close_session, open_session
    from app.tools.screenshots import _interesting_token

    session = open_session("light")
    window = session.window
    try:
        window.start(None, None)
        await window.host.wait_engine()
        window.settings.apply_preset("Balanced")
        window.settings.update_sampler(seed=7)
        window.settings.set_max_new_tokens(64)
        conv = window.library.new()  # the conversation send() answers in
        answer = await window.controller.send(PROMPT)
        if answer is None:  # send() answers every non-empty prompt
            raise RuntimeError("the window did not answer the prompt")
        tokens = conv.tokens(answer)
        window.view_options.set_heatmap(True)
        window.selection.set(answer.id, _interesting_token(tokens))
        window.inspector.tabs.setCurrentWidget(window.inspector.stages)
        window.status.clearMessage()  # "Loaded …" would still show: the labels as people read them
        await _settle()
        save_window(window, out)
    finally:
        await close_session(session)


def save_window(window: QWidget, out: Path) -> None:
    """The window as it is on screen, saved as an image at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(out))
    log.info("saved %s (%dx%d)", out, window.width(), window.height())


def run_at_size(argv: list[str], shoot: Callable[[Path], Coroutine[Any, Any, None]]) -> int:
    """`SIZE OUT` (e.g. `1024x700 docs/x.png`): the offscreen screen set to SIZE, then `shoot(OUT)` on a qasync loop."""
    size, out = argv[0], Path(argv[1])
    width, height = (int(v) for v in size.lower().split("x"))
    _use_screen(width, height)
    import qasync
    from PySide6.QtWidgets import QApplication

    logging.basicConfig(level=logging.INFO)
    app = QApplication(sys.argv[:1])
    app.setQuitOnLastWindowClosed(False)
    with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
        runner.run(shoot(out))
    return 0


def main(argv: list[str]) -> int:
    return run_at_size(argv, _shoot)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
