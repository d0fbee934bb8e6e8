"""A model's answer is shown as text: raw HTML is never interpreted, and its links open only as
http(s), only after the user has seen the full address and said yes."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QDesktopServices, QTextCursor
from PySide6.QtWidgets import QMessageBox

from app.widgets.chat import model_links


def _answer(qtbot, window, content: str):
    """A finished answer with `content` in the open conversation, laid out on screen; returns its body widget."""
    conv = window.library.current
    user = conv.add_message(None, "user", "tell me")
    answer = conv.add_message(user, "assistant")
    conv.append_tokens(answer, [])
    answer.content = content
    conv.update_message(answer, finish_reason="eos")
    body = window.chat.chat_view.widget_for(answer.id).body
    qtbot.waitUntil(lambda: body.isVisible() and body.width() > 300, timeout=5000)
    return body


@pytest.mark.parametrize(
    "text",
    [
        "Use the <div> tag to group elements",
        "std::vector<int> v;",
        "a <b>bold</b> word and <script>alert(1)</script> after",
        "x <!-- a comment --> y",
        "<div>\nblock\n</div>\n\nafter the block",
    ],
)
def test_tags_in_an_answer_are_shown_as_text(qtbot, window, text):
    body = _answer(qtbot, window, text)
    shown = " ".join(body.document().toPlainText().split())
    assert shown == " ".join(text.split())


def test_tags_survive_while_the_answer_streams(qtbot, window):
    body = _answer(qtbot, window, "")
    body.show_markdown("")
    body.append_text("Use the <div> tag")
    body.append_text(" to group elements")
    body.finish()
    assert body.markdown_renders >= 1
    assert body.document().toPlainText() == "Use the <div> tag to group elements"


def _click_anchor(qtbot, body, label: str) -> None:
    """Click the middle of the link whose text is `label`."""
    position = body.document().toPlainText().index(label) + len(label) // 2
    cursor = QTextCursor(body.document())
    cursor.setPosition(position)
    assert body.anchorAt(body.cursorRect(cursor).center()), f"{label} is not a link"
    qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=body.cursorRect(cursor).center())


LINKS = {
    "jsLink": "javascript:alert(1)",
    "smbLink": "smb://attacker.example/share",
    "fileLink": "file:///etc/passwd",
    "absLink": "/etc/passwd",
    "relLink": "notes.txt",
    "httpsLink": "https://example.com/a/very/long/path?q=1&token=secret",
}


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    urls: list[str] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: urls.append(url.toString()) or True)
    return urls


def test_only_http_links_open_and_only_after_the_user_confirms(qtbot, window, opened, monkeypatch, tmp_path):
    (tmp_path / "notes.txt").write_text("LOCAL FILE CONTENT")
    monkeypatch.chdir(tmp_path)
    asked: list[str] = []
    answer = {"value": QMessageBox.StandardButton.No}

    def question(_parent, _title, text, *_args, **_kwargs):
        asked.append(text)
        return answer["value"]

    monkeypatch.setattr(model_links.QMessageBox, "question", question)
    content = "Links: " + " · ".join(f"[{label}]({url})" for label, url in LINKS.items())
    body = _answer(qtbot, window, content)
    shown = body.document().toPlainText()

    for label in ("jsLink", "smbLink", "fileLink", "absLink", "relLink"):
        _click_anchor(qtbot, body, label)
        assert body.document().toPlainText() == shown, f"{label} replaced the answer"
    assert opened == [] and asked == []  # nothing else opens, and no question is asked about them

    _click_anchor(qtbot, body, "httpsLink")
    assert opened == [] and len(asked) == 1  # the user said no
    assert LINKS["httpsLink"] in asked[0]  # the full address was shown

    answer["value"] = QMessageBox.StandardButton.Yes
    _click_anchor(qtbot, body, "httpsLink")
    assert opened == [LINKS["httpsLink"]]
    assert body.document().toPlainText() == shown


def test_an_answer_loads_no_resources(qtbot, window, tmp_path):
    image = tmp_path / "pic.png"
    from PySide6.QtGui import QImage

    QImage(4, 4, QImage.Format.Format_RGB32).save(str(image))
    body = _answer(qtbot, window, f"![pic]({image.as_uri()}) and ![pic2]({image})")
    from PySide6.QtGui import QTextDocument

    assert body.loadResource(QTextDocument.ResourceType.ImageResource, image.as_uri()) is None
    assert body.loadResource(QTextDocument.ResourceType.ImageResource, str(image)) is None


def test_a_model_name_and_an_error_from_a_server_are_shown_as_text(qtbot, window):
    """Labels take HTML by default when text looks like it: a server's name or error page is not markup."""
    conv = window.library.current
    user = conv.add_message(None, "user", "tell me")
    answer = conv.add_message(user, "assistant")
    conv.append_tokens(answer, [])
    answer.model = {"name": "<b>evil</b> <img src='file:///etc/passwd'>"}
    conv.update_message(answer, finish_reason="error", stats={"error": "HTTP 500: <html><body><h1>Oops</h1></body></html>"})
    widget = window.chat.chat_view.widget_for(answer.id)
    for label in (widget.model_label, widget.footer):
        assert label.textFormat() == Qt.TextFormat.PlainText
    assert "<html>" in widget.footer.text() and "<b>evil</b>" in widget.model_label.text()
    # Its tooltip (the whole name, where the label elides it) shows the tags as text too.
    assert "&lt;b&gt;evil&lt;/b&gt;" in widget.model_label.toolTip() and "<img" not in widget.model_label.toolTip()
