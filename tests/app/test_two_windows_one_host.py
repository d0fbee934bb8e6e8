"""A window closed while another stays open on the same engine host leaves nothing of itself subscribed to the
host: the next model load reaches only the living window (it used to fail with "SamplingModeBox already deleted")."""

from __future__ import annotations

import gc

from qt_helpers import close_window, make_window, run_task


def test_a_closed_windows_sampling_panel_no_longer_hears_the_host(qtbot, window, store, host):
    second = make_window(qtbot, store, host)
    panel = second.sampling
    close_window(qtbot, second)
    qtbot.waitUntil(lambda: not _alive(panel), timeout=5000)
    gc.collect()
    errors: list[str] = []
    window.controller.error.connect(errors.append)
    assert run_task(qtbot, host.load("mock", "mock")), host.last_error
    assert host.info is not None and not errors


def _alive(widget) -> bool:
    from shiboken6 import isValid

    return isValid(widget)
