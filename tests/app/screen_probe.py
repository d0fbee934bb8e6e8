"""Open the window on a screen of a given size, report its layout as JSON, close it (saving the layout).

Run by tests/app/test_small_screen.py in a subprocess: the screen of Qt's offscreen platform is chosen
when the application starts (`-platform offscreen:configfile=...`), so each screen size is a process.

    python tests/app/screen_probe.py WIDTH HEIGHT DATA_DIR [framed]

`framed`: the offscreen platform draws a frame (title bar and borders) around each window, as a window
manager does; the report then has the frames of the window and of Compare.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path


def screen_config(width: int, height: int, framed: bool = False) -> str:
    """A config file for Qt's offscreen platform with one screen of width x height."""
    config = {"synchronousWindowSystemEvents": False, "windowFrameMargins": framed,
              "screens": [{"name": "probe", "x": 0, "y": 0, "width": width, "height": height,
                           "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}
    path = Path(tempfile.mkdtemp(prefix="logitlab-screen-")) / "screen.json"
    path.write_text(json.dumps(config))
    return str(path)


def _inside(window, widget) -> bool:
    """Whether `widget` (a dock, the chat) lies wholly inside the window, which lies inside its screen."""
    from PySide6.QtCore import QPoint

    top_left = widget.mapTo(window, QPoint(0, 0))
    return top_left.x() >= 0 and top_left.x() + widget.width() <= window.width() and widget.width() > 0


async def _probe(data_dir: Path) -> dict:
    from PySide6.QtWidgets import QApplication

    from app.controllers.engine_host import EngineHost
    from app.main_window import MainWindow
    from app.state.database.store import Store
    from app.widgets.inspection.inspector import MIN_WIDTH
    from qt_helpers import mock_factory

    data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(data_dir / "probe.sqlite3")
    host = EngineHost(mock_factory())
    await host.load("mock", "mock")
    window = MainWindow(store, host)
    window.show()
    # The widest state the issue found: an answer in the token view (its legend in the header), a token selected.
    window.settings.set_max_new_tokens(8)
    window.library.new()
    answer = await window.controller.send("the cat")
    window.view_options.set_heatmap(True)
    window.selection.set(answer.id, 1)
    for _ in range(10):
        QApplication.processEvents()
        await asyncio.sleep(0.02)
    free = window.screen().availableGeometry()
    hint = window.minimumSizeHint()
    from app.actions.experiments import open_compare

    compare = open_compare(window.context)
    for _ in range(40):  # past the refits after showing (app/window_geometry.py REFIT_AFTER_MS)
        QApplication.processEvents()
        await asyncio.sleep(0.025)
    rect = lambda r: [r.x(), r.y(), r.width(), r.height()]  # noqa: E731
    report = {
        "frame": rect(window.frameGeometry()),
        "compare_frame": rect(compare.frameGeometry()),
        "compare_minimum_hint": [compare.minimumSizeHint().width(), compare.minimumSizeHint().height()],
        "screen": [free.width(), free.height()],
        "size": [window.width(), window.height()],
        "position": [window.x(), window.y()],
        "minimum_hint": [hint.width(), hint.height()],
        "inside": {name: _inside(window, widget) for name, widget in
                   (("chats", window.chats_dock), ("inspector", window.inspector_dock), ("chat", window.chat))},
        "inspector_width": window.inspector.width(),
        "inspector_min_width": MIN_WIDTH,
        "chat_width": window.chat.width(),
    }
    # The Loom tab raised in the Inspector's place: the chat column it leaves (310 px at 1024x700 before).
    window.loom_dock.raise_()
    await window.loom_view.continuations_at(answer, 1)  # the loom with rows drawn
    for _ in range(20):
        QApplication.processEvents()
        await asyncio.sleep(0.025)
    report["chat_width_loom"] = window.chat.width()
    report["loom_min_width"] = window.loom_dock.minimumSizeHint().width()
    # The Steering tab raised in the left dock, a vector listed in it (issue 33): the chat column it leaves.
    import numpy as np
    from engine import steering

    window.controller.steering.add(steering.SteeringVector("a-vector-with-a-long-name", np.ones((4, 8))
                                                          * (np.arange(4) > 0)[:, None]), keep=False)
    window.steering_dock.raise_()
    for _ in range(20):
        QApplication.processEvents()
        await asyncio.sleep(0.025)
    report["chat_width_steering"] = window.chat.width()
    window.chats_dock.raise_()
    window.inspector_dock.raise_()
    compare.close()
    closed = asyncio.get_running_loop().create_future()
    window.closed.connect(lambda: closed.done() or closed.set_result(True))
    window.close()  # saves the layout, as quitting does
    await closed
    host.close(wait=True)
    store.close()
    return report


def main(argv: list[str]) -> int:
    width, height, data_dir = int(argv[0]), int(argv[1]), Path(argv[2])
    framed = argv[3:] == ["framed"]
    sys.argv = [sys.argv[0], "-platform", f"offscreen:configfile={screen_config(width, height, framed)}"]
    import qasync
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        report = loop.run_until_complete(_probe(data_dir))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # qt_helpers
    sys.exit(main(sys.argv[1:]))
