"""Attachments in the real window (offscreen, the mock model): the paperclip, drop and paste, chips with their
tokens that can be removed, the context label counting them before sending, a message that does not fit said
by how much with its first part sent on request, the sent message's chips; and each bad file one line under
the box with nothing else changed."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from documents_files import encrypted_pdf, make_pdf
from engine.documents import compose_message
from qt_helpers import answered


def _file(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _counted(composer) -> bool:
    return bool(composer.attachments) and composer.attachment_tokens() is not None


def _send(qtbot, window, text: str):
    edit = window.chat.composer.edit
    edit.setPlainText(text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: answered(window), timeout=15000)
    return window.library.current.path()


@pytest.mark.slow
def test_paperclip_chips_and_the_model_reads_the_files_before_the_question(qtbot, window, tmp_path, monkeypatch):
    composer = window.chat.composer
    notes = _file(tmp_path, "notes.md", b"# Notes\n\nthe cat sat on the mat.\n")
    report = _file(tmp_path, "report.pdf", make_pdf(["the dog and the cat."]))
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(notes), str(report)], ""))
    qtbot.mouseClick(composer.attach_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(composer.attachments) == 2 and _counted(composer), timeout=5000)
    names = [chip.label.text() for chip in composer.chips.chips]
    assert names[0].startswith("notes.md · 33 B · ") and names[0].endswith(" tokens")
    assert names[1].startswith("report.pdf · ") and composer.chips.isVisible()
    tokenizer = window.host.engine.tokenizer
    assert "attached" in window.status.context_label.text()
    # ✕ takes one off before sending; the other stays, the context label follows.
    pdf_chip = composer.chips.chip(composer.attachments[1].sha256)
    qtbot.mouseClick(pdf_chip.remove_button, Qt.MouseButton.LeftButton)
    assert [a.name for a in composer.attachments] == ["notes.md"]
    tokens = composer.attachment_tokens()
    assert f"+ {tokens:,} attached" in window.status.context_label.text()

    user, answer = _send(qtbot, window, "what sat")
    assert user.content == "what sat" and [a.name for a in user.attachments] == ["notes.md"]
    assert composer.attachments == [] and not composer.chips.isVisible()
    assert "attached" not in window.status.context_label.text()
    chips = window.chat.chat_view.widget_for(user.id).attachment_chips
    assert chips.isVisible() and chips.chips[0].label.text() == "notes.md · 33 B"
    # The model read the file's block, then the question, as prompt tokens like any other prompt text.
    composed = compose_message("what sat", user.attachments).text
    assert answer.stats["prompt_tokens"] == len(tokenizer.chat_ids([{"role": "user", "content": composed}]))


def test_files_dropped_or_pasted_on_the_box_are_attached_not_typed(qtbot, window, tmp_path):
    composer = window.chat.composer
    first = _file(tmp_path, "a.txt", b"the cat")
    second = _file(tmp_path, "b.csv", b"a,b\n1,2\n")
    composer.edit.setPlainText("question")
    assert composer.send_button.isEnabled()
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(first))])
    viewport = composer.edit.viewport()
    enter = QDragEnterEvent(QPoint(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(viewport, enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(viewport, drop)
    assert not composer.send_button.isEnabled()  # read off the UI thread: Send waits for it
    qtbot.waitUntil(lambda: len(composer.attachments) == 1, timeout=5000)
    pasted = QMimeData()
    pasted.setUrls([QUrl.fromLocalFile(str(second))])
    QApplication.clipboard().setMimeData(pasted)
    composer.edit.paste()
    qtbot.waitUntil(lambda: len(composer.attachments) == 2, timeout=5000)
    assert [a.name for a in composer.attachments] == ["a.txt", "b.csv"] and composer.send_button.isEnabled()
    assert composer.edit.toPlainText() == "question"  # no path typed in


def test_each_bad_file_is_one_line_and_nothing_else_changes(qtbot, window, tmp_path):
    composer = window.chat.composer
    composer.edit.setPlainText("my question, typed")
    assert composer.attach_file(str(_file(tmp_path, "good.txt", b"the cat")))
    huge = tmp_path / "huge.log"
    with huge.open("wb") as f:
        f.truncate(500 * 1024 * 1024)
    bad = {
        _file(tmp_path, "pic.png", b"\x89PNG\r\n\x1a\n\x00"): "Not attached: pic.png: is a PNG image, not text",
        _file(tmp_path, "latin.txt", b"caf\xe9"): "Not attached: latin.txt: is not UTF-8 text (byte 0xe9 on line 1",
        _file(tmp_path, "locked.pdf", encrypted_pdf(["x"])): "Not attached: locked.pdf: is an encrypted PDF",
        _file(tmp_path, "broken.pdf", b"%PDF-1.7\n1 0 obj"): "Not attached: broken.pdf: is not a readable PDF (",
        _file(tmp_path, "scan.pdf", make_pdf([""], with_text=False)): "Not attached: scan.pdf: has no text layer",
        huge: "Not attached: huge.log: is 500.0 MB; attachments are limited to 20.0 MB",
        tmp_path / "gone.txt": "Not attached: gone.txt: no such file",
    }
    for path, words in bad.items():
        assert not composer.attach_file(str(path))
        assert composer.attach_error.isVisible() and composer.attach_error.text().startswith(words)
        assert "\n" not in composer.attach_error.text()
        assert [a.name for a in composer.attachments] == ["good.txt"]
        assert composer.edit.toPlainText() == "my question, typed"
    assert composer.attach_file(str(_file(tmp_path, "fine.md", b"the mat")))
    assert not composer.attach_error.isVisible()


def test_a_file_that_vanishes_after_attaching_is_sent_as_it_was_read(qtbot, window, tmp_path):
    composer = window.chat.composer
    path = _file(tmp_path, "temp.txt", b"the cat sat")
    assert composer.attach_file(str(path))
    path.unlink()
    user, _answer = _send(qtbot, window, "the")
    assert [a.text for a in user.attachments] == ["the cat sat"]


@pytest.mark.slow
def test_attachments_over_the_context_say_by_how_much_and_the_first_part_is_sent(qtbot, window, tmp_path):
    composer = window.chat.composer
    context = window.host.info.context_length
    big = _file(tmp_path, "book.txt", b"".join(b" the cat sat on the mat.\n" for _ in range(1500)))
    assert composer.attach_file(str(big))
    qtbot.waitUntil(lambda: _counted(composer), timeout=5000)
    tokens = composer.attachment_tokens()
    assert tokens > context
    assert composer.fit_label.isVisible()
    assert f"the attachments take {tokens:,} tokens" in composer.fit_label.text()
    used = window.status.context_used() or 0
    assert f"{used + tokens - context:,} more than the model's context of {context:,}" in composer.fit_label.text()
    assert composer.first_part_button.isVisible()
    qtbot.mouseClick(composer.first_part_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: answered(window), timeout=15000)
    user, answer = window.library.current.path()
    assert [a.name for a in user.attachments] == ["book.txt (first part)"]
    assert big.read_text().startswith(user.attachments[0].text)
    assert answer.finish_reason != "error" and answer.stats["prompt_tokens"] < context


@pytest.mark.slow
def test_an_edit_keeps_the_files_and_score_text_reads_what_the_model_read(qtbot, window, tmp_path, closing):
    from app.actions.experiments import open_score
    from qt_helpers import run_task

    composer = window.chat.composer
    assert composer.attach_file(str(_file(tmp_path, "notes.txt", b"the cat sat on the mat.")))
    user, _answer = _send(qtbot, window, "the dog")
    conv = window.library.current
    window.on_edit_submitted(user, "the fox")
    qtbot.waitUntil(lambda: answered(window) and conv.path()[0] is not user, timeout=15000)
    edited = conv.path()[0]
    assert edited.content == "the fox" and edited.attachments == user.attachments
    assert window.store.document_count() == 1  # linked again, not stored again
    # Score text on the question scores the text the model read, the file's block included, token by token.
    view = open_score(window.context)
    closing(view)
    assert view.messages.itemText(1) == "the fox (+ 1 attached)"
    view.messages.setCurrentIndex(1)
    view.messages.activated.emit(1)
    assert view.text.toPlainText() == compose_message("the fox", edited.attachments).text
    run_task(qtbot, view.run())
    assert view.body.rendered_tokens == len(view.result.tokens) > 5
    view.close()
