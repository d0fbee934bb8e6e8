"""Chat ▸ Export as Markdown says how an answer that did not end on its own ended (issue 43 item 6).

Before, a stopped answer read as the model's whole reply: the export had its text and nothing else. The
message records how it ended (`finish_reason`, and `stats.interrupted_by` for a quit), and the export
says it under the answer, with its length in tokens.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from qt_helpers import answered, send

from app.state.export import to_markdown


def test_a_stopped_answer_is_said_stopped_with_its_length_and_a_finished_one_is_not(qtbot, window):
    finished = send(qtbot, window, "the cat")
    conv = window.library.current
    assert "interrupted" not in to_markdown(conv)  # an answer that ended on its own has no note

    window.settings.set_max_new_tokens(400)  # long enough to be stopped mid-way (the mock writes a token per 10 ms)
    edit = window.chat.composer.edit
    edit.setPlainText("a long answer, please")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.controller.busy and len(conv.tokens(conv.path()[-1])) >= 3, timeout=10000)
    window.controller.stop()
    qtbot.waitUntil(lambda: answered(window), timeout=10000)
    stopped = conv.path()[-1]
    assert stopped is not finished and stopped.finish_reason == "cancelled"
    n = len(conv.tokens(stopped))
    assert 3 <= n < 400
    md = to_markdown(conv)
    answer_part = md.split("## Assistant")[-1]
    assert f"*(interrupted: stopped by the user after {n} tokens)*" in answer_part
    assert md.count("interrupted") == 1  # the first answer, finished, still has none


def test_a_quit_an_error_and_the_length_limit_are_said_in_words(qtbot, window):
    answer = send(qtbot, window, "the cat")
    conv = window.library.current
    n = len(conv.tokens(answer))
    cases = (
        (None, {"interrupted_by": "SIGTERM"}, f"*(interrupted: the app quit (SIGTERM) after {n} tokens)*"),
        (None, {}, f"*(interrupted: the app ended before the answer was finished, after {n} tokens)*"),
        ("length", None, f"*(cut off at the length limit after {n} tokens)*"),
        ("error", {"error": "the server closed\nthe connection"},
         f"*(interrupted by an error after {n} tokens: the server closed the connection)*"),
    )
    for finish, stats, said in cases:
        conv.update_message(answer, finish_reason=finish, stats=stats)
        assert said in to_markdown(conv), (finish, stats, to_markdown(conv))
