"""`python -m app.loom_screenshot [--model M] OUT_DIR`: the loom screenshot of docs/loom.md.

The default model answers a question; the loom then makes 4 children with
their own seeds from the answer's fourth token and 3 beam-search children from
its second, and the Loom tab shows the tree with one of the beam children open
in the chat. Runs in a temporary data dir, at 1440x900, with a fixed seed so
retakes look alike.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path

from PySide6.QtWidgets import QApplication

log = logging.getLogger(__name__)

QUESTION = "Write one sentence about the sea."
SIZE = (1440, 900)


async def take_loom_screenshot(window, out_dir: str | Path, size: tuple[int, int] = SIZE) -> Path:
    from app.screenshots import _save, _settle
    from app.widgets.loom_view import NODE

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    window.resize(*size)
    if window.theme is not None:
        window.theme.set_scheme("light")
    await window.host.wait_engine()
    await _settle()
    window.settings.apply_preset("Balanced")
    window.settings.update_sampler(seed=11)
    window.settings.set_max_new_tokens(24)
    answer = await window.controller.send(QUESTION)
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


async def _main(model: str | None, backend: str | None, out: str, size: tuple[int, int]) -> None:
    from app.lifecycle import close_session, open_session

    session = open_session("light")
    window = session.window
    window.start(model, backend)
    try:
        await take_loom_screenshot(window, out, size)
    finally:
        window.close()
    await session.closed
    await close_session(session)


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.loom_screenshot")
    p.add_argument("out_dir")
    p.add_argument("--model", default=None, help="default: the default model")
    p.add_argument("--backend", default=None)
    p.add_argument("--size", default="1440x900", help="window size, WIDTHxHEIGHT")
    args = p.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    logging.basicConfig(level=logging.INFO)
    import qasync

    from app.paths import DATA_DIR_ENV
    from app.qt_compat import guard_none_refcount

    os.environ[DATA_DIR_ENV] = tempfile.mkdtemp(prefix="logitlab-loom-shot-")
    guard_none_refcount()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setQuitOnLastWindowClosed(False)
    with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
        runner.run(_main(args.model, args.backend, args.out_dir, size))
    return 0


if __name__ == "__main__":
    sys.exit(run())
