"""The command line of a one-picture screenshot script (`app.tools.loom_screenshot`, `app.tools.notebook_screenshot`).

Parses `OUT_DIR [--model M] [--backend B] [--size WxH]`, opens the real window
in a temporary data dir (so the user's own chats are never touched), lets
`take(window, out_dir, size)` drive it and save its picture, and closes
everything as the app does on quit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Qt and the window load after the arguments are read
    from app.main_window import MainWindow

# take(window, out_dir, (width, height)) drives the window and saves its picture(s); what it returns is not used.
Take = Callable[["MainWindow", str, tuple[int, int]], Awaitable[object]]


async def _session(take: Take, model: str | None, backend: str | None, out: str, size: tuple[int, int]) -> None:
    from app.lifecycle import close_session, open_session

    session = open_session("light")
    window = session.window
    window.start(model, backend)
    try:
        await take(window, out, size)
    finally:
        window.close()
    await session.closed
    await close_session(session)


def run_shot(argv: list[str] | None, prog: str, take: Take, *, model_help: str = "default: the default model",
             default_model: Callable[[], str | None] = lambda: None) -> int:
    """Run one screenshot script; returns the exit code."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("out_dir")
    p.add_argument("--model", default=None, help=model_help)
    p.add_argument("--backend", default=None)
    p.add_argument("--size", default="1440x900", help="window size, WIDTHxHEIGHT")
    args = p.parse_args(argv)
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        p.error(f"--size must be WIDTHxHEIGHT, got {args.size!r}")
    logging.basicConfig(level=logging.INFO)
    import qasync

    from app.application import application
    from app.state.paths import DATA_DIR_ENV

    os.environ[DATA_DIR_ENV] = tempfile.mkdtemp(prefix="logitlab-shot-")
    application()
    model = args.model or default_model()
    with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
        runner.run(_session(take, model, args.backend, args.out_dir, (width, height)))
    return 0
