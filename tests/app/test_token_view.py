"""The assistant text as Markdown or as coloured tokens; hover, click and the chart select tokens."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QToolTip

from app.widgets.fmt import pct
from app.widgets.heat import confidence, heat_color
from qt_helpers import send


def _background_at(body, position: int):
    cursor = QTextCursor(body.document())
    cursor.setPosition(position + 1)  # charFormat() is the format of the character before the cursor
    return cursor.charFormat().background().color()


def test_heatmap_colours_follow_the_measure_and_hover_and_chart_select(qtbot, window):
    window.settings.update_sampler(seed=2)
    answer = send(qtbot, window, "the cat")
    tokens = window.library.current.tokens(answer)
    widget = window.chat.chat_view.widget_for(answer.id)
    assert widget.body.mode == "markdown"

    window.view_options.set_heatmap(True)
    body = widget.body
    assert body.mode == "tokens" and window.chat.legend.isVisible()
    dark = False
    for mode in ("probability", "surprisal", "entropy"):
        window.view_options.set_mode(mode)
        for i in (0, len(tokens) // 2):
            start, _ = body.token_span(i)
            want = heat_color(confidence(tokens[i], mode), dark)
            assert _background_at(body, start).rgba() == want.rgba(), (mode, i)

    i = 3
    qtbot.mouseMove(body.viewport(), body.token_rect(i))
    qtbot.waitUntil(lambda: QToolTip.isVisible() or bool(QToolTip.text()), timeout=8000)  # a busy machine is slow
    assert pct(tokens[i].prob) in QToolTip.text() and "rank" in QToolTip.text()

    chart = window.inspector.chart
    assert chart.count == len(tokens)  # with nothing selected it shows the last answer
    j = len(tokens) - 2
    qtbot.mouseClick(chart, Qt.MouseButton.LeftButton, pos=QPoint(int(chart.x_of(j)), chart.height() // 2))
    assert (window.selection.message_id, window.selection.index) == (answer.id, j)
    assert body.extraSelections() and body.extraSelections()[0].cursor.selectionStart() == body.token_span(j)[0]
    qtbot.keyClick(window, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    assert window.selection.index == j - 1


def test_markdown_renders_code_blocks_monospaced(qtbot, window):
    conv = window.library.current
    user = conv.add_message(None, "user", "show code")
    answer = conv.add_message(user, "assistant")
    conv.append_tokens(answer, [])  # nothing: a message may start empty
    answer.content = "Here:\n\n```python\ndef f(x):\n    return x\n```\n\n**Done**."
    conv.update_message(answer, finish_reason="eos")
    body = window.chat.chat_view.widget_for(answer.id).body
    doc = body.document()
    block = doc.findBlock(doc.toPlainText().index("def f"))
    assert block.charFormat().fontFixedPitch() or block.blockFormat().nonBreakableLines()
    assert "**" not in doc.toPlainText()  # bold was rendered, not shown as asterisks


def test_a_banned_string_step_back_is_marked_in_the_token_view(qtbot, window):
    """The inspector names the banned phrase; the chat marks where the answer stepped back, and says why on hover."""
    from app.widgets.fmt import token_tooltip
    from app.widgets.chat.message_body import STEP_BACK_COLOR

    window.settings.update_sampler(temperature=0.0)
    first = send(qtbot, window, "the cat")
    words = first.content.split()
    window.settings.update_sampler(banned_strings=(words[1],))  # a word the greedy answer says: banned now
    window.library.new()  # the same prompt again, in a new chat
    answer = send(qtbot, window, "the cat")
    tokens = window.library.current.tokens(answer)
    stepped = [i for i, t in enumerate(tokens) if t.rewind is not None]
    assert stepped and words[1] not in answer.content.split()
    window.view_options.set_heatmap(True)
    body = window.chat.chat_view.widget_for(answer.id).body
    for i in (stepped[0], stepped[0] - 1):
        start, _ = body.token_span(i)
        cursor = QTextCursor(body.document())
        cursor.setPosition(start + 1)
        fmt = cursor.charFormat()
        marked = fmt.underlineStyle() == fmt.UnderlineStyle.WaveUnderline and fmt.underlineColor().name() == STEP_BACK_COLOR
        assert marked == (i == stepped[0]), i
    tip = token_tooltip(tokens[stepped[0]])
    assert "stepped back here" in tip and words[1] in tip
