"""Issue 37 item 7 and issue 36 item 3 in the window: an invalid constraint stops Send (and says why, the
text kept); a big grammar is built off the UI thread, and one past a limit is refused in a line.

Before: the red error showed and Send went out under the previous grammar; pasting a 3,000-rule Lark
chain killed the window (built on the UI thread, SIGSEGV in llguidance).
"""

from __future__ import annotations

import gc
import time

import pytest
from PySide6.QtCore import QTimer

from engine import Constraint

from app.widgets.sampling.structured_output import CHECK_DELAY_MS, StructuredOutputBox
from qt_helpers import run_task


def _box(window) -> StructuredOutputBox:
    box = window.sampling.findChild(StructuredOutputBox)
    assert box is not None
    return box


def _set(qtbot, box: StructuredOutputBox, mode: str, text: str) -> None:
    box.mode.setCurrentIndex(box.mode.findText(mode))
    box.editor.setPlainText(text)
    box.apply()
    qtbot.waitUntil(lambda: not box.checking, timeout=30_000)


class _Ticks:
    """The largest gap between ticks of a 10 ms timer on the UI thread: how long the window froze."""

    def __init__(self) -> None:
        self.largest = 0.0
        self._last = time.monotonic()
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    def _tick(self) -> None:
        now = time.monotonic()
        self.largest = max(self.largest, now - self._last)
        self._last = now


def test_an_invalid_constraint_stops_send_and_says_why(qtbot, window):
    box, composer, settings = _box(window), window.chat.composer, window.settings
    _set(qtbot, box, "Regex", r"(yes|no)\.")
    assert settings.options.constraint == Constraint.regex(r"(yes|no)\.") and settings.constraint_problem is None

    _set(qtbot, box, "Regex", "(yes|no")  # typed on: invalid
    assert box.valid is False
    assert "unclosed group" in settings.constraint_problem
    composer.edit.setPlainText("Answer me")
    assert not composer.send_button.isEnabled()
    assert "unclosed group" in composer.send_button.toolTip()
    composer.submit()  # Enter: nothing is sent, and the text stays
    assert composer.edit.toPlainText() == "Answer me"
    conv = window.library.current
    before = len(conv.messages) if conv is not None else 0
    with pytest.raises(ValueError, match="Not sent: the regular expression cannot be used"):
        run_task(qtbot, window.controller.send("Answer me"))
    after = len(window.library.current.messages) if window.library.current is not None else 0
    assert after == before  # no message was added under the old constraint

    _set(qtbot, box, "Regex", "(yes|no)")  # fixed: Send is back
    assert settings.constraint_problem is None and composer.send_button.isEnabled()
    _set(qtbot, box, "Regex", "(yes|no")
    box.mode.setCurrentIndex(box.mode.findText("Off"))  # or turned off: Send is back too
    qtbot.waitUntil(lambda: not box.checking)
    assert settings.constraint_problem is None and settings.options.constraint is None


def test_while_a_grammar_is_checked_nothing_is_sent_under_the_old_one(qtbot, window):
    box, settings = _box(window), window.settings
    _set(qtbot, box, "Regex", "a+")
    box.editor.setPlainText("b+")  # typed: until the pause and the check, it is not the one shown
    assert settings.constraint_problem and "being checked" in settings.constraint_problem
    qtbot.waitUntil(lambda: not box.checking)
    assert settings.constraint_problem is None and settings.options.constraint == Constraint.regex("b+")


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_a_big_grammar_is_built_off_the_ui_thread(qtbot, window):
    """A pasted 900-rule grammar is checked (about a second of llguidance's GBNF conversion, pure Python) while
    the window stays live.

    The paste goes the user's way: the editor's text changes, and the check starts when the typing pauses
    (`CHECK_DELAY_MS`). Starting the build in the same moment as the paste (calling `apply()` at once) froze the
    window up to ~0.9 s in a process that had made a window before: laying out the 900 pasted lines asks for
    the interpreter lock at every step, and each time waits behind the conversion's thread; laid out first
    (12 ms), the build froze nothing. A shorter switch interval hid it, and made PySide abort at exit.
    """
    box = _box(window)
    grammar = "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(900)) + 'r900 ::= "b"\n'
    box.mode.setCurrentIndex(box.mode.findText("Grammar"))
    qtbot.waitUntil(lambda: not box.checking, timeout=60_000)
    # A full collection in a process that has run the whole suite pauses every thread for longer than the bound
    # (0.69 s seen): not what is measured here, so it runs before and not during the measurement.
    gc.collect()
    was_enabled = gc.isenabled()  # off already where the window tests collect on the UI thread (conftest.py)
    gc.disable()
    try:
        ticks = _Ticks()
        t0 = time.monotonic()
        box.editor.setPlainText(grammar)  # pasted: checked once the typing pauses
        assert box.checking and box.valid is None and window.settings.constraint_problem is not None
        qtbot.waitUntil(lambda: not box.checking, timeout=60_000)
        took = time.monotonic() - t0
        ticks.timer.stop()
    finally:
        if was_enabled:
            gc.enable()
    assert box.valid, box.status.text()
    assert window.settings.options.constraint is not None and window.settings.options.constraint.kind == "gbnf"
    assert took > CHECK_DELAY_MS / 1000 + 0.2  # a real build happened after the pause
    assert ticks.largest < 0.25, f"the window froze {ticks.largest:.2f} s while the grammar was built"


def test_a_grammar_past_the_limit_is_refused_in_a_line_and_the_window_lives(qtbot, window):
    box = _box(window)
    chain = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(3000)) + 'r3000: "b"\n'
    _set(qtbot, box, "Grammar", chain)
    assert box.valid is False
    assert "has 3,002 rules; the limit is 1,000" in box.status.text()
    assert "has 3,002 rules" in window.settings.constraint_problem


def test_loom_continuations_wait_for_a_valid_constraint_too(qtbot, window):
    box = _box(window)
    window.settings.set_max_new_tokens(4)
    answer = run_task(qtbot, window.controller.send("the cat"))  # Structured output off (the mock has no byte vocabulary)
    assert answer is not None and answer.tokens
    _set(qtbot, box, "Regex", "( the| cat")  # invalid now
    errors: list[str] = []
    window.loom.error.connect(errors.append)
    made = run_task(qtbot, window.loom.continuations(answer, 0, 2))
    assert made == [] and errors and "Not sent: the regular expression cannot be used" in errors[-1]
