"""Start the real window on `$LOGITLAB_DATA_DIR` (offscreen, no model), show every conversation, then quit.

Run as a child process by the hostile-file tests: the app must still start after
a hostile import, and on a database an older version left poisoned rows in.
Prints `STARTED <conversations> <messages shown>` and exits 0 when it did.

`start_window.py FILE...` first imports each FILE through the Loom tab's Import…
button (the file dialog answered with it) and prints `IMPORT <the tab's status line>`.
"""

from __future__ import annotations

import asyncio
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import qasync  # noqa: E402


async def main() -> int:
    from app.lifecycle import close_session, open_session

    session = open_session("light")
    window = session.window
    for path in sys.argv[1:]:
        from PySide6.QtWidgets import QFileDialog

        QFileDialog.getOpenFileName = staticmethod(lambda *_a, _p=path, **_k: (_p, ""))
        window.loom_view.import_button.click()
        await asyncio.sleep(0.05)
        print("IMPORT " + window.loom_view.status.text().replace("\n", "\\n"), flush=True)
    shown = 0
    rows = window.library.summaries()
    for row in rows:
        conv = window.library.open(row.id)
        await asyncio.sleep(0.05)  # let the views build and paint
        for message in conv.messages.values():
            conv.show(message)  # every branch on screen once
            await asyncio.sleep(0)
            shown += 1
    window.repaint()
    await asyncio.sleep(0.1)
    print(f"STARTED {len(rows)} {shown}", flush=True)
    await close_session(session)
    return 0


if __name__ == "__main__":
    from app.application import application

    application()  # as app/__main__.py makes it
    with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:  # Python 3.11 has no asyncio.run(loop_factory=)
        sys.exit(runner.run(main()))
