"""`python -m app` / `logitlab`: open the window at once and load the model in the background."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import tempfile

import qasync

from app import __version__
from app.state.paths import DATA_DIR_ENV
from app.platform_check import check_linux_desktop_libraries, no_display_message
from engine import BACKENDS

log = logging.getLogger("app")
# After the window has closed: how long the models' threads get to end before the process leaves without them.
RELEASE_WAIT_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="logitlab", description="Chat with a local model and see how it samples.")
    p.add_argument("--model", help="a model folder, a .gguf file or a hub id (default: the last one used)")
    p.add_argument("--backend", choices=BACKENDS, help="how to run it (default: auto)")
    p.add_argument("--appearance", choices=("system", "light", "dark"), help="colour scheme (default: as last time)")
    p.add_argument("--data-dir", help=f"where conversations are kept (default: ${DATA_DIR_ENV} or the user data dir)")
    p.add_argument(
        "--screenshot-dir",
        help="drive the window through the README screenshots, save them here and quit (uses a temporary data dir)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    p.add_argument("--version", action="version", version=f"Logit Lab {__version__}")
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> int:
    """Build the window, start loading the model, and run until the window has closed and saved.

    The database opens whatever state it is in (a damaged or unwritable one gets a dialog, never a
    silent exit); SIGTERM, SIGHUP and SIGINT close the window as the user would (app/lifecycle.py).
    """
    from app.lifecycle import close_session, open_session

    session = open_session(args.appearance)
    window = session.window
    # Everything built so far lives as long as the app: keep the cyclic GC from rescanning it.
    gc.freeze()
    window.start(args.model, args.backend)
    try:
        if args.screenshot_dir:
            from app.tools.screenshots import take_screenshots

            try:
                await take_screenshots(window, args.screenshot_dir)
            finally:
                window.close()
        await session.closed
    finally:
        await close_session(session)
    return 0


def run(argv: list[str] | None = None) -> int:
    if "--self-test" in (sys.argv[1:] if argv is None else argv):
        from app.selftest import run as run_selftest

        return run_selftest(argv)
    args = parse_args(argv)
    from app.logs import setup_logging

    setup_logging(args.verbose)  # the user's log file (Help ▸ Show log file), plus stderr when there is one
    if (message := no_display_message()) is not None:  # Qt would abort with a message about its xcb plugin
        log.error("%s", message)
        return 1
    check_linux_desktop_libraries()  # before Qt: one line naming missing X11 packages (Linux)
    if args.data_dir:
        os.environ[DATA_DIR_ENV] = args.data_dir
    elif args.screenshot_dir:
        os.environ[DATA_DIR_ENV] = tempfile.mkdtemp(prefix="logitlab-screenshots-")
    from app.application import application

    application()
    if sys.version_info >= (3, 12):
        code = asyncio.run(main(args), loop_factory=qasync.QEventLoop)
    else:
        # Python 3.11's asyncio.run has no loop_factory; asyncio.Runner is what it wraps.
        with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
            code = runner.run(main(args))
    return exit_without_busy_threads(code)


def exit_without_busy_threads(code: int) -> int:
    """`code`, or leave the process at once when a model thread is still busy after RELEASE_WAIT_S.

    By now the window has written everything and the database is closed; the models' threads were
    cancelled and are releasing their models. One still busy (a load or a connection that cannot be
    interrupted) would hold the interpreter's exit, or be torn down inside native code: nothing of
    ours is left to lose, so the process ends without it.
    """
    from engine import busy_workers, close_all

    if close_all(RELEASE_WAIT_S):
        return code
    busy = busy_workers()
    log.info("exiting without waiting for %s", ", ".join(busy))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(run())
