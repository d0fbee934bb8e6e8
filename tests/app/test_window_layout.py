"""The window at 1440×900 and 1024×700: the sampling panel fits its dock (every control and value fully
visible at 1440×900, usable at 1024×700), a saved wide layout keeps a readable inspector, and a first start
fits the screen."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLabel,
    QLineEdit,
    QWidget,
)


def _show_sampling(qtbot, window, size: tuple[int, int]):
    window.resize(*size)
    window.sampling_dock.show()
    window.sampling_dock.raise_()
    panel = window.sampling
    qtbot.waitUntil(lambda: panel.isVisible() and window.width() == size[0])
    for _ in range(5):  # let the dock and the panel's layout settle at the new size
        QApplication.processEvents()
    return panel


def _clipped(panel) -> list[str]:
    """Every visible control of the panel that reaches past the viewport's right edge or is narrower than its text."""
    viewport = panel.viewport()
    problems = []
    for w in panel.widget().findChildren(QWidget):
        if not w.isVisibleTo(panel) or w.width() == 0:
            continue
        name = w.accessibleName() or (w.text() if hasattr(w, "text") and isinstance(w.text(), str) else "") or type(w).__name__
        right = w.mapTo(viewport, QPoint(w.width(), 0)).x()
        if right > viewport.width():
            problems.append(f"{name!r} ends at x={right}, past the viewport's {viewport.width()}")
        if isinstance(w, QLabel) and w.wordWrap():
            continue
        if isinstance(w, (QAbstractSpinBox, QAbstractButton, QLabel, QComboBox)) and w.width() < w.sizeHint().width():
            problems.append(f"{name!r} is {w.width()} px wide but its text needs {w.sizeHint().width()}")
        if isinstance(w, QLineEdit) and w.width() < w.minimumWidth():
            problems.append(f"{name!r} is narrower than its minimum")
    return problems


@pytest.mark.parametrize("size", [(1440, 900), (1024, 700)], ids=["1440x900", "1024x700"])
def test_sampling_panel_fits_its_dock(qtbot, window, size):
    panel = _show_sampling(qtbot, window, size)
    assert not _clipped(panel), "\n".join(_clipped(panel))
    assert not panel.horizontalScrollBar().isVisible()
    assert panel.widget().width() <= panel.viewport().width()
    # Nothing of the panel hides under the inspector or off the window.
    assert panel.mapTo(window, QPoint(panel.width(), 0)).x() <= window.centralWidget().geometry().left()
    # Every value box shows its widest value ("0 (greedy)", "100000") in full.
    for row in [*panel.rows.values(), panel.max_tokens]:
        assert row.spin.width() >= row.spin.sizeHint().width(), row.spec.label
        assert row.slider.width() >= 40, f"{row.spec.label}: slider squeezed to {row.slider.width()} px"
    # The stage list shows all its stages without scrolling inside it, and no blank band under them.
    stages = panel.stage_order.list
    last = stages.visualItemRect(stages.item(stages.count() - 1))
    assert 0 < stages.viewport().height() - last.bottom() <= last.height()
    # The last controls can be reached by scrolling down (vertically only).
    bar = panel.verticalScrollBar()
    bar.setValue(bar.maximum())
    QApplication.processEvents()
    down = panel.stage_order.down
    bottom = down.mapTo(panel.viewport(), QPoint(0, down.height())).y()
    assert 0 < bottom <= panel.viewport().height()


def test_sampling_panel_dock_cannot_be_narrowed_below_its_controls(qtbot, window):
    panel = _show_sampling(qtbot, window, (1024, 700))
    window.resizeDocks([window.sampling_dock], [60], Qt.Orientation.Horizontal)
    qtbot.waitUntil(lambda: panel.width() >= panel.minimumWidth())
    for _ in range(5):
        QApplication.processEvents()
    assert not _clipped(panel), "\n".join(_clipped(panel))


def test_wheel_over_a_control_scrolls_the_panel_instead_of_changing_the_value(qtbot, window):
    panel = _show_sampling(qtbot, window, (1024, 700))
    bar = panel.verticalScrollBar()
    assert bar.maximum() > 0  # the panel scrolls at this size
    bar.setValue(0)
    row = panel.rows["repetition_penalty"]
    before = window.settings.options
    for target in (row.slider, row.spin):
        target.clearFocus()
        pos = QPointF(target.width() / 2, target.height() / 2)
        event = QWheelEvent(
            pos, target.mapToGlobal(pos), QPoint(0, 0), QPoint(0, -120),
            Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False,
        )
        QApplication.sendEvent(target, event)
    assert window.settings.options == before
    assert bar.value() > 0


def test_shrinking_a_wide_layout_takes_width_from_the_chat_not_the_inspector(qtbot, window, store, host):
    """A layout saved at 1440 px and opened at 1024x700: the inspector keeps a readable width."""
    from qt_helpers import close_window, make_window

    from app.widgets.inspection.inspector import MIN_WIDTH

    window.resize(1440, 900)
    window.show()
    qtbot.waitExposed(window)
    window.resizeDocks([window.inspector_dock], [470], Qt.Orientation.Horizontal)
    close_window(qtbot, window)  # saves the layout
    window = make_window(qtbot, store, host)
    window.show()
    qtbot.waitExposed(window)
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024)
    assert window.inspector.width() >= MIN_WIDTH
    assert window.chat.width() > 0
    close_window(qtbot, window)


def _docks_inside(window) -> list[str]:
    problems = []
    for dock in (window.chats_dock, window.inspector_dock):
        if dock.isVisible() and not (0 <= dock.geometry().left() and dock.geometry().right() < window.width()):
            problems.append(f"{dock.windowTitle()} spans x={dock.geometry().left()}..{dock.geometry().right()} "
                            f"in a window {window.width()} wide")
    return problems


def test_a_first_start_fits_the_screen(qtbot, qloop, store, host):
    """No saved geometry: the default size where the screen has room, else the screen's free area (the
    offscreen test screen is 800x800), with the side panels inside the window."""
    from app.main_window import DEFAULT_SIZE, MainWindow
    from qt_helpers import close_window

    window = MainWindow(store, host)
    try:
        window.show()
        qtbot.waitExposed(window)
        free, least = window.screen().availableGeometry(), window.minimumSizeHint()
        assert free.width() < DEFAULT_SIZE[0]  # the branch under test
        # the screen's width, or the narrowest the window's panels allow where the screen is narrower still
        assert window.width() == max(free.width(), least.width()) < DEFAULT_SIZE[0]
        assert window.height() == max(min(free.height(), DEFAULT_SIZE[1]), least.height())
        assert not _docks_inside(window), _docks_inside(window)
        for screen, expected in (((1024, 700), (1024, 700)), ((1440, 900), DEFAULT_SIZE)):
            window.size_to_fit(*screen)
            qtbot.waitUntil(lambda expected=expected: (window.width(), window.height()) == expected)
            assert not _docks_inside(window), (screen, _docks_inside(window))
            assert window.inspector_dock.width() >= 300 * expected[0] // DEFAULT_SIZE[0]
    finally:
        close_window(qtbot, window)
