"""Open the window on a screen of a given size and report what a person would find clipped, as JSON (issue 43
item 6): the sampling panel with DRY open (a sideways scroll bar?), an invalid grammar's error (all of it
shown?), the chat's title and legend, the inspector's tabs, the status bar. Run by
tests/app/test_window_fit_round3.py in a subprocess (the offscreen screen's size is fixed per process):

    python tests/app/layout_probe.py WIDTH HEIGHT DATA_DIR [PICTURE.png]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

BAD_GRAMMAR = 'root ::= "yes" | "no" | undefined_rule_with_a_long_name_that_the_grammar_never_defines anywhere'


async def _spin(seconds: float) -> None:
    from PySide6.QtWidgets import QApplication

    for _ in range(max(1, int(seconds / 0.025))):
        QApplication.processEvents()
        await asyncio.sleep(0.025)


def _shown_whole(widget, within) -> bool:
    """`widget` is visible and lies wholly inside `within`'s visible rectangle (a viewport, the window)."""
    from PySide6.QtCore import QPoint, QRect

    if not widget.isVisible() or widget.width() <= 0 or widget.height() <= 0:
        return False
    top_left = widget.mapTo(within, QPoint(0, 0))
    return QRect(QPoint(0, 0), within.size()).contains(QRect(top_left, widget.size()))


async def _probe(data_dir: Path) -> dict:
    from PySide6.QtWidgets import QScrollArea, QTabBar, QToolButton

    from app.controllers.engine_host import EngineHost
    from app.main_window import MainWindow
    from app.state.database.store import Store
    from app.widgets.sampling.structured_output import StructuredOutputBox
    from qt_helpers import mock_factory

    data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(data_dir / "probe.sqlite3")
    host = EngineHost(mock_factory())
    await host.load("mock", "mock")
    window = MainWindow(store, host)
    window.show()
    window.settings.set_max_new_tokens(8)
    window.library.new()
    await window.controller.send("Why is the sky blue? Answer in a short paragraph.")
    window.view_options.set_heatmap(True)
    await _spin(0.8)
    report: dict = {"size": [window.width(), window.height()]}

    pane = window.chat
    report["title_width"] = pane.title_label.width()
    report["title_needs"] = pane.title_label.fontMetrics().horizontalAdvance(pane.title_label.text()[:12])
    report["legend_width"] = pane.legend.width()
    report["legend_needs"] = pane.legend.sizeHint().width()
    report["legend_shown"] = _shown_whole(pane.legend, window)

    tabs = window.inspector.tabs
    bar: QTabBar = tabs.tabBar()
    arrows = [b for b in bar.findChildren(QToolButton) if b.isVisible()]
    report["inspector_tab_arrows"] = len(arrows)
    report["inspector_tabs_inside"] = all(bar.tabRect(i).right() <= bar.width() for i in range(bar.count()))
    status = window.status
    report["status_inside"] = _shown_whole(status, window)
    report["status_labels_whole"] = {w.accessibleName(): w.width() >= w.sizeHint().width()
                                     for w in (status.memory_label, status.context_label, status.speed_label)}

    window.sampling_dock.raise_()
    panel = window.sampling
    dry = panel.groups.sections["DRY (repetition of phrases)"]
    dry.set_open(True)
    await _spin(0.5)
    sideways = window.findChild(QScrollArea, "sampling_sideways")
    report["sampling_hbar"] = sideways.horizontalScrollBar().isVisible()
    report["sampling_hbar_range"] = sideways.horizontalScrollBar().maximum()
    report["sampling_panel_min"] = panel.minimumWidth()
    report["sampling_viewport"] = sideways.viewport().width()

    box = panel.findChild(StructuredOutputBox)
    box.mode.setCurrentIndex(next(i for i in range(box.mode.count()) if box.mode.itemData(i) == "gbnf"))
    box.editor.setPlainText(BAD_GRAMMAR)
    box.apply()
    for _ in range(200):
        await _spin(0.05)
        if box.valid is False:
            break
    label = box.status
    for _ in range(20):  # scrolled to, as a person would; its lines may still be laid out when first scrolled to
        panel.ensureWidgetVisible(label)
        await _spin(0.1)
        if _shown_whole(label, sideways.viewport()) and _shown_whole(label, window):
            break
    report["grammar_error"] = label.text()
    report["grammar_error_height"] = label.height()
    report["grammar_error_needs"] = label.heightForWidth(label.width())
    report["grammar_error_width"] = label.width()
    report["grammar_error_inside_box"] = _shown_whole(label, box)
    report["grammar_error_on_screen"] = _shown_whole(label, sideways.viewport()) and _shown_whole(label, window)
    report["sampling_hbar_after_error"] = sideways.horizontalScrollBar().isVisible()
    if len(sys.argv) > 1 and sys.argv[-1].endswith(".png"):  # a picture of the state probed, to look at
        window.grab().save(sys.argv[-1])
    closed = asyncio.get_running_loop().create_future()
    window.closed.connect(lambda: closed.done() or closed.set_result(True))
    window.close()
    await closed
    host.close(wait=True)
    store.close()
    return report


def main(argv: list[str]) -> int:
    from screen_probe import screen_config

    width, height, data_dir = int(argv[0]), int(argv[1]), Path(argv[2])
    sys.argv = [sys.argv[0], "-platform", f"offscreen:configfile={screen_config(width, height)}", *argv[3:4]]
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
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # qt_helpers, screen_probe
    sys.exit(main(sys.argv[1:]))
