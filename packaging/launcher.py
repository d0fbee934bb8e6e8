"""The packaged app's entry point (PyInstaller runs this file as `__main__`).

It logs to the user's log file from the first line on (a double-clicked app
has no terminal) and dispatches `--self-test` to `app.selftest`; everything
else is `app.__main__.run`, the same code as the `logitlab` command.
"""

from __future__ import annotations

import multiprocessing
import sys


def main() -> int:
    multiprocessing.freeze_support()  # a child process started by a library re-runs this file
    from engine.templates.process import RENDERER_FLAG

    if sys.argv[1:2] == [RENDERER_FLAG]:  # the chat-template renderer process (engine/templates/process.py)
        from engine.templates.process import serve

        serve()
        return 0
    from app.logs import ensure_std_streams, setup_logging

    ensure_std_streams()
    argv = sys.argv[1:]
    if "--self-test" in argv:
        from app.selftest import run as run_selftest

        return run_selftest(argv)
    # app.__main__.run's logging.basicConfig finds these handlers and adds none of its own.
    setup_logging(verbose="-v" in argv or "--verbose" in argv)
    from app.__main__ import run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
