"""Small screens (issue 26 item 6): the window fits 1024x700 with every panel inside it, a restored layout is
clamped to the screen it opens on (and one saved on another screen size starts afresh there), and neither
connecting to a server with a long model name nor opening Replay makes a window larger than the screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from qt_helpers import close_window, run_task

from app.window_geometry import Rect, Size, clamp_rect, same_screen_size

PROBE = Path(__file__).with_name("screen_probe.py")
ROOT = Path(__file__).resolve().parents[2]


# -- the rule, as pure functions -------------------------------------------------------------------------

def test_a_rect_is_clamped_into_the_screen_and_keeps_its_minimum():
    small = Rect(0, 0, 1024, 700)
    # A 1400x880 layout from a large screen: as large as the screen, at its corner.
    assert clamp_rect(Rect(300, 120, 1400, 880), small) == Rect(0, 0, 1024, 700)
    # One that fits stays where it was, or moves in from the edge it hung over.
    assert clamp_rect(Rect(100, 50, 800, 600), small) == Rect(100, 50, 800, 600)
    assert clamp_rect(Rect(900, 650, 800, 600), small) == Rect(224, 100, 800, 600)
    assert clamp_rect(Rect(-500, -40, 800, 600), small) == Rect(0, 0, 800, 600)
    # A second screen to the right, with a task bar at the top: its own coordinates.
    right = Rect(1920, 30, 1024, 670)
    assert clamp_rect(Rect(100, 0, 1400, 880), right) == Rect(1920, 30, 1024, 670)
    # A minimum larger than the screen wins, and the top-left corner stays on the screen.
    assert clamp_rect(Rect(200, 200, 900, 600), small, Size(1100, 500)) == Rect(0, 100, 1100, 600)


def test_a_layout_saved_on_another_screen_size_is_told_apart():
    assert same_screen_size(Size(1024, 700), Rect(0, 0, 1024, 700))
    assert not same_screen_size(Size(1440, 900), Rect(0, 0, 1024, 700))
    assert not same_screen_size(None, Rect(0, 0, 1024, 700))  # saved before the screen was recorded


# -- the window on real (offscreen) screens of 1024x700 and 1440x900 -------------------------------------

def _probe(width: int, height: int, data_dir: Path, framed: bool = False) -> dict:
    env = {**os.environ, "LOGITLAB_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)}
    env.pop("QT_QPA_PLATFORM", None)  # the probe picks the offscreen platform with its own screen
    extra = ["framed"] if framed else []
    done = subprocess.run([sys.executable, str(PROBE), str(width), str(height), str(data_dir), *extra], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fits(report: dict) -> None:
    width, height = report["screen"]
    assert report["minimum_hint"][0] <= width and report["minimum_hint"][1] <= height, report
    x, y = report["position"]
    assert x >= 0 and y >= 0 and x + report["size"][0] <= width and y + report["size"][1] <= height, report
    assert all(report["inside"].values()), report
    assert report["inspector_width"] >= report["inspector_min_width"], report
    assert report["chat_width"] >= 300, report  # the conversation keeps a readable column
    assert report["chat_width_loom"] >= 300, report  # ... also with the Loom tab raised and rows drawn in it
    assert report["chat_width_steering"] >= 300, report  # ... and with the Steering tab raised, a vector in it


@pytest.mark.slow
def test_the_window_fits_1024x700_and_a_layout_follows_the_screen_it_opens_on(tmp_path):
    """A first start on 1024x700; a layout saved on 1440x900 opened on 1024x700; and back again."""
    # The first start has a data folder of its own, so its window process runs while the other three (which
    # share one folder, each opening what the one before saved) run one after another.
    with ThreadPoolExecutor(1) as pool:
        first_run = pool.submit(_probe, 1024, 700, tmp_path / "small-first")
        data = tmp_path / "moved"
        large = _probe(1440, 900, data)
        small = _probe(1024, 700, data)  # the large layout, restored on the small screen
        again = _probe(1440, 900, data)  # the small layout, restored on the large screen: not left small
        first = first_run.result()
    assert first["screen"] == [1024, 700] and first["size"] == [1024, 700]
    _fits(first)

    assert large["size"] == [1400, 880]  # the default size, where the screen has room
    _fits(large)
    assert small["size"] == [1024, 700]
    _fits(small)
    assert again["size"] == [1400, 880]
    _fits(again)


# -- nothing grows a window past the screen --------------------------------------------------------------

LONG_MODEL = "an-organisation-with-a-long-name/" + "a-model-with-a-very-long-name-" * 4 + "GGUF-Q4_K_M"


@pytest.mark.slow
def test_connecting_to_a_server_with_a_long_model_name_does_not_widen_the_window(qtbot, window):
    from remote_server import CharModel, FakeServer

    from app.widgets.dialogs.connect_dialog import ConnectChoice

    class LongNamedModel(CharModel):
        def __call__(self, method, path, body):
            if path == "/v1/models":
                from remote_server import Reply

                return Reply({"object": "list", "data": [{"id": LONG_MODEL, "object": "model"}]})
            return super().__call__(method, path, body)

    server = FakeServer(LongNamedModel({"a": 0.6, "b": 0.3}))
    try:
        window.resize(1024, 700)
        qtbot.waitUntil(lambda: window.width() == 1024)
        choice = ConnectChoice(server.url, LONG_MODEL, None, 60.0, False, False)
        assert run_task(qtbot, window.models.connect_server(choice), timeout_ms=30000)
        assert LONG_MODEL.split("/")[-1] in window.status.model_label.text()  # the whole name is there
        for _ in range(5):
            QApplication.processEvents()
        assert window.minimumSizeHint().width() <= 1024
        assert (window.width(), window.height()) == (1024, 700)
        # A status message gets room: the labels step back while it shows, the model's first.
        status = window.status
        status.clearMessage()  # "Loaded …" may still show
        QApplication.processEvents()
        without = status.model_label.width()
        message = "Generation failed: the server closed the connection"
        status.showMessage(message, 5000)
        QApplication.processEvents()
        shown = [w for w in (status.template_label, *status._labels) if not w.isHidden()]
        assert min(w.geometry().left() for w in shown) >= status.fontMetrics().horizontalAdvance(message)
        assert status.model_label.width() < without
        assert all(w.width() >= w.sizeHint().width() for w in shown)  # the others are whole
        window.status.clearMessage()
        QApplication.processEvents()
        assert window.status.model_label.width() > 300  # without a message it has the rest of the bar
    finally:
        close_window(qtbot, window)
        server.close()


def test_replay_opens_no_larger_than_the_screen(qtbot, window, closing):
    from qt_helpers import send

    from app.actions.experiments import open_replay

    send(qtbot, window, "the cat")
    free = window.screen().availableGeometry()  # the offscreen test screen: 800x800
    for with_change in (False, True):
        view = open_replay(window.context, with_change)
        closing(view)
        assert view.width() <= free.width() and view.height() <= free.height(), (view.size(), free)
        view.close()


# -- the frame the window manager adds (issue 37 item 3) ---------------------------------------------------

def test_a_framed_window_is_clamped_with_its_frame():
    from app.window_geometry import Margins, clamp_framed

    small, frame = Rect(0, 0, 1024, 700), Margins(4, 30, 4, 4)
    # The inside sized to the whole free area: the frame would hang over every edge; now all of it fits.
    assert clamp_framed(Rect(0, 0, 1024, 700), frame, small) == Rect(4, 30, 1016, 666)
    # A window that fits with its frame stays as it is.
    assert clamp_framed(Rect(100, 100, 600, 400), frame, small) == Rect(100, 100, 600, 400)
    # Its minimum keeps room for the frame, and the title bar stays on the screen.
    assert clamp_framed(Rect(0, 0, 900, 900), frame, small, Size(900, 800)) == Rect(4, 30, 900, 800)


def _inside_screen(frame: list[int], screen: list[int]) -> bool:
    x, y, width, height = frame
    return x >= 0 and y >= 0 and x + width <= screen[0] and y + height <= screen[1]


@pytest.mark.slow
def test_with_a_window_manager_frame_the_window_and_compare_fit_1024x700(tmp_path):
    """The title bar and borders count: the window's status bar and Compare's bottom stay on the screen."""
    report = _probe(1024, 700, tmp_path / "framed", framed=True)
    screen = report["screen"]
    assert report["frame"][3] > report["size"][1], report  # the platform did draw a frame
    assert _inside_screen(report["frame"], screen), report
    assert _inside_screen(report["compare_frame"], screen), report
    # Narrow enough for a 1024-pixel screen with room to spare, the frame's borders included.
    assert report["minimum_hint"][0] <= 960 and report["compare_minimum_hint"][0] <= 960, report
