"""Code blocks in an answer get a background, Pygments' colours and a Copy button, and stay text; the token
view breaks lines only between tokens ("<h" / "2>" stays "<h2>")."""

from __future__ import annotations

from pygments.lexers import PythonLexer
from pygments.styles import get_style_by_name
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QTextCursor

from engine import TokenEvent, TokenProb

from app.theme import is_dark
from app.widgets.chat.code_block import DARK_STYLE, LIGHT_STYLE, code_colors

CODE = 'def greet(name):\n    # say hello\n    return "<b>" + name + "</b>"'
ANSWER = f"Here it is:\n\n```python\n{CODE}\n```\n\nAnd plain:\n\n```\n<script>alert(1)</script>\n```\n\nDone."


def _answer(qtbot, window, content: str = "", events: list[TokenEvent] | None = None):
    conv = window.library.current
    user = conv.add_message(None, "user", "show me")
    answer = conv.add_message(user, "assistant")
    if events is not None:
        conv.set_tokens(answer, events, "".join(e.text for e in events))
    else:
        conv.append_tokens(answer, [])
        answer.content = content
    conv.update_message(answer, finish_reason="eos")
    widget = window.chat.chat_view.widget_for(answer.id)
    qtbot.waitUntil(lambda: widget.body.isVisible() and widget.body.width() > 300, timeout=5000)
    return widget


def _format_at(body, position: int):
    cursor = QTextCursor(body.document())
    cursor.setPosition(position + 1)  # the format of the character before the cursor
    return cursor.charFormat()


def test_a_code_block_has_a_background_colours_and_a_copy_button(qtbot, window):
    body = _answer(qtbot, window, ANSWER).body
    python, plain = body.code_blocks
    assert (python.language, python.code) == ("python", CODE)
    assert (plain.language, plain.code) == ("", "<script>alert(1)</script>")  # a tag in code is text
    dark = is_dark(body.palette())
    assert python.frame.frameFormat().background().color() == code_colors(dark)[0]

    # Each word is coloured as Pygments' own lexer and style colour it.
    style = get_style_by_name(DARK_STYLE if dark else LIGHT_STYLE)
    text = body.document().toPlainText()
    start = text.index(CODE)
    coloured = 0
    for offset, ttype, value in PythonLexer().get_tokens_unprocessed(CODE):
        want = style.style_for_token(ttype)["color"]
        if want and value.strip():
            got = _format_at(body, start + offset).foreground().color()
            assert got == QColor("#" + want), (value, ttype)
            coloured += 1
    assert coloured >= 5
    assert _format_at(body, start).fontFixedPitch()

    # One Copy button per block, on the block; a click copies that block's code.
    buttons = body.copy_buttons.buttons
    assert len(buttons) == 2 and all(b.isVisible() for b in buttons)
    layout = body.document().documentLayout()
    for block, button in zip(body.code_blocks, buttons):
        assert layout.frameBoundingRect(block.frame).toRect().contains(button.geometry())
    qtbot.mouseClick(buttons[0], Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == CODE and buttons[0].text() == "Copied"
    qtbot.mouseClick(buttons[1], Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "<script>alert(1)</script>"


def test_code_blocks_follow_a_streaming_answer(qtbot, window):
    body = _answer(qtbot, window, "").body
    body.show_markdown("")
    for i in range(0, len(ANSWER), 7):
        body.append_text(ANSWER[i : i + 7])
    body.finish()
    assert [b.code for b in body.code_blocks] == [CODE, "<script>alert(1)</script>"]
    body.show_tokens([], "probability", False)
    assert body.code_blocks == [] and not any(b.isVisible() for b in body.copy_buttons.buttons)


def _events(pieces: list[str]) -> list[TokenEvent]:
    alts = (TokenProb(1, "x", -0.5, None),)
    return [TokenEvent(index=i, token_id=i + 1, text=p, token_text=p, logprob=-0.5, sampler_logprob=-0.4,
                       rank=0, entropy=1.0, top_model=alts, top_sampler=alts) for i, p in enumerate(pieces)]


PIECES = ["<h2>"] * 40 + [" well-known", " path/to/file", " the", "世界", " end"] * 6


def test_the_token_view_never_breaks_a_line_inside_a_token(qtbot, window):
    widget = _answer(qtbot, window, events=_events(PIECES))
    window.view_options.set_heatmap(True)
    body = widget.body
    assert body.mode == "tokens" and body.rendered_tokens == len(PIECES)
    assert body.visible_text() == "".join(PIECES)
    for width in (330, 260, 410):
        widget.setFixedWidth(width)
        qtbot.waitUntil(lambda: body.width() < width, timeout=3000)
        breaks = _line_starts(body)
        assert len(breaks) > 3  # it does wrap
        starts = {body.token_span(i)[0] for i in range(len(PIECES))}
        text = body.toPlainText()
        for pos in breaks:
            # A line starts at a token, or just after the zero-width space that opens one.
            assert pos in starts or (pos - 1 in starts and text[pos - 1] == "\u200b"), (width, text[pos - 6 : pos + 6])
    # Copying from the token view gives the tokens' text, without the joiners.
    body.selectAll()
    assert body.createMimeDataFromSelection().text() == "".join(PIECES)


def _line_starts(body) -> list[int]:
    """Document positions where a wrapped line begins (the first line of each paragraph left out)."""
    out = []
    block = body.document().begin()
    while block.isValid():
        layout = block.layout()
        out.extend(block.position() + layout.lineAt(i).textStart() for i in range(1, layout.lineCount()))
        block = block.next()
    return out


def test_a_long_code_line_wraps_inside_a_narrow_answer_and_the_button_stays_in_sight(qtbot, window):
    long_line = "result = compute(" + ", ".join(f"argument_{i}" for i in range(30)) + ")"
    widget = _answer(qtbot, window, f"```python\n{long_line}\n```")
    body = widget.body
    widget.setFixedWidth(380)
    qtbot.waitUntil(lambda: body.width() < 380, timeout=3000)
    (block,) = body.code_blocks
    frame = body.document().documentLayout().frameBoundingRect(block.frame)
    assert frame.right() <= body.viewport().width()  # nothing of the code runs past the answer's column
    assert body.viewport().rect().contains(body.copy_buttons.buttons[0].geometry())
    qtbot.mouseClick(body.copy_buttons.buttons[0], Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == long_line  # the wrapped line copies as one line


def test_code_blocks_take_the_colours_of_a_new_palette(qtbot, window):
    from PySide6.QtGui import QPalette

    body = _answer(qtbot, window, ANSWER).body
    assert not is_dark(body.palette())
    assert body.code_blocks[0].frame.frameFormat().background().color() == code_colors(False)[0]
    dark = QPalette(body.palette())
    dark.setColor(QPalette.ColorRole.Window, QColor("#1e1f22"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#e4e4e7"))
    body.setPalette(dark)  # as a switch to the dark theme reaches it
    assert body.code_blocks[0].frame.frameFormat().background().color() == code_colors(True)[0]
    start = body.document().toPlainText().index("def")
    assert _format_at(body, start).foreground().color() == QColor("#" + get_style_by_name(DARK_STYLE).style_for_token(
        next(t for _, t, v in PythonLexer().get_tokens_unprocessed(CODE) if v == "def"))["color"])
