"""The loom's Audit rows in the panel (issue 43 item 2): progress row by row, a Stop that stops it, one summary line
(the per-row report was written into the status label line by line and squeezed the tree to three rows)."""

from __future__ import annotations

from qt_helpers import send


def _children(qtbot, window, n: int = 3):
    answer = send(qtbot, window, "hello there")
    view = window.loom_view
    window.loom_dock.raise_()
    window.selection.set(answer.id, 1)
    view.rebuild()
    view.n_spin.setValue(n)
    view.tokens_spin.setValue(6)
    view.continue_button.click()
    task = next(iter(view._tasks))
    qtbot.waitUntil(task.done, timeout=15000)
    window.selection.set(answer.id, 1)
    return view


def test_the_audit_shows_its_rows_as_it_goes_and_ends_with_one_line(qtbot, window):
    view = _children(qtbot, window)
    formats: list[str] = []
    buttons: list[tuple[bool, bool]] = []  # (Stop, Audit rows) enabled, while it runs
    set_value = view.progress.setValue

    def seen(v: int) -> None:
        formats.append(view.progress.format())
        buttons.append((view.stop_button.isEnabled(), view.audit_button.isEnabled()))
        set_value(v)

    view.progress.setValue = seen
    task = view.audit()
    qtbot.waitUntil(task.done, timeout=30000)
    assert buttons and all(b == (True, False) for b in buttons), buttons
    assert task.exception() is None
    audit = view.last_audit
    assert audit is not None and len(audit.rows) == 3 and not audit.stopped
    assert "Audit: row 1 of 3" in formats and "Audit: row 3 of 3" in formats, formats
    text = view.status.text()
    assert text.startswith("Audit: ") and "\n" not in text and "of 3 rows repeated" in text, text
    assert view.status.toolTip().count("\n") == 3  # a line per row, then the overall one
    assert view.audit_button.isEnabled() and not view.stop_button.isEnabled()


def test_stop_ends_the_audit_with_the_rows_it_finished(qtbot, window):
    view = _children(qtbot, window, n=4)
    set_value = view.progress.setValue

    def stop_at_the_second_row(v: int) -> None:
        set_value(v)
        if v == 1:
            view.stop_button.click()

    view.progress.setValue = stop_at_the_second_row
    task = view.audit()
    qtbot.waitUntil(task.done, timeout=30000)
    audit = view.last_audit
    assert audit is not None and audit.stopped and 1 <= len(audit.rows) < 4, audit
    assert "stopped after" in view.status.text(), view.status.text()
    assert view.audit_button.isEnabled()
