"""The message box: Enter sends, Shift+Enter starts a new line; Send turns into Stop while generating.

Files are attached with the paperclip, by dropping them on the box or pasting them (docs/documents.md): each
is read and checked at once (engine/documents), shown as a chip above the box (name, size, tokens, ✕), and
goes with the next message sent. A file that cannot be attached is one line under the box; nothing else
changes (the typed text, the other chips).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QMimeData, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolTip, QVBoxLayout, QWidget

from engine import documents

from app.widgets.chat.attachment_chips import ChipRow

# Counts an attachment's tokens (off the UI thread where it can) and calls back with the count (None: unknown).
TokenCounter = Callable[[documents.Attachment, Callable[[int | None], None]], None]
# Runs a job off the UI thread, then done(result, error) on it; False when it could not start (EngineHost's).
OffThread = Callable[[Callable[[], Any], Callable[[Any, "BaseException | None"], None]], bool]


def _local_files(mime: QMimeData) -> list[str]:
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile()] if mime.hasUrls() else []


def _is_enter(event: QKeyEvent) -> bool:
    return event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class ComposerEdit(QPlainTextEdit):
    """Enter (and Ctrl+Enter) submits, Shift+Enter starts a new line. Files dropped or pasted on it are
    `files_given` (their paths), not their paths typed in as text."""

    submitted = Signal()
    files_given = Signal(list)  # [str]: local paths
    accepts_files = False  # the composer's box; the box that edits a sent message takes text only

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return (self.accepts_files and bool(_local_files(source))) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        files = _local_files(source) if self.accepts_files else []
        if files:
            self.files_given.emit(files)
            return
        super().insertFromMimeData(source)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self.accepts_files and _local_files(event.mimeData()):
            event.acceptProposedAction()
            return
        super().dragEnterEvent(event)

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        if self.accepts_files and _local_files(event.mimeData()):
            event.acceptProposedAction()
            return
        super().dragMoveEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:
        files = _local_files(event.mimeData()) if self.accepts_files else []
        if files:
            event.acceptProposedAction()
            self.files_given.emit(files)
            return
        super().dropEvent(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if _is_enter(event) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class MessageEdit(ComposerEdit):
    """The box that edits a sent message: keys as in the composer, and Esc cancels.

    The window's own shortcuts (Esc stops an answer, Ctrl+Enter sends the composer's text) would
    take these keys before the box sees them: it claims them while it has the focus.
    """

    cancelled = Signal()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent) and (
            _is_enter(event) or event.key() == Qt.Key.Key_Escape
        ):
            event.accept()  # delivered as a key press to this box, not as the window's shortcut
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Escape:
            self.cancelled.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)  # the text; the files sent with it are `take_sent_attachments()`
    stop_requested = Signal()
    attach_requested = Signal()  # the paperclip: the window asks for files (it knows the last folder used)
    attachments_changed = Signal()  # a file attached or removed, or its tokens counted
    send_first_part_requested = Signal()  # the offer under an attachment that does not fit

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._busy = False
        self._blocked: str | None = None  # why nothing may be sent now (an invalid structured-output constraint)
        self.attachments: list[documents.Attachment] = []
        self.tokens: dict[str, int | None] = {}  # sha256 -> the attachment's tokens (None: not counted yet)
        self._sent: list[documents.Attachment] = []
        self.token_counter: TokenCounter | None = None
        # Files dropped, pasted or chosen are read here when set (a 100-page PDF's text takes a second); Send waits.
        self.off_thread: OffThread | None = None
        self.reading = 0  # batches of files being read
        self.edit = ComposerEdit(self)
        self.edit.accepts_files = True
        self.edit.files_given.connect(self.attach_files)
        self.attach_button = QPushButton("Attach…")
        self.attach_button.setAccessibleName("Attach files")
        self.attach_button.setToolTip("Attach text, Markdown, code, CSV/JSON or PDF files (or drop them on the box)")
        self.attach_button.clicked.connect(self.attach_requested)
        self.chips = ChipRow(removable=True)
        self.chips.remove_requested.connect(self.remove_attachment)
        self.attach_error = QLabel()  # one line: why the last file could not be attached
        self.attach_error.setAccessibleName("Attachment problem")
        self.attach_error.setWordWrap(True)
        self.attach_error.setTextFormat(Qt.TextFormat.PlainText)
        self.attach_error.setVisible(False)
        self.fit_label = QLabel()  # the attachments' cost against the context, when they do not fit
        self.fit_label.setAccessibleName("Attachments do not fit")
        self.fit_label.setWordWrap(True)
        self.fit_label.setVisible(False)
        self.first_part_button = QPushButton("Send the first part")
        self.first_part_button.setToolTip("Cut the last attachment to what fits the context, then send")
        self.first_part_button.setVisible(False)
        self.first_part_button.clicked.connect(self.send_first_part_requested)
        self.edit.setPlaceholderText("Message the model — Enter to send, Shift+Enter for a new line")
        self.edit.setAccessibleName("Message")
        self.edit.setTabChangesFocus(True)
        line = self.edit.fontMetrics().lineSpacing()
        self.edit.setFixedHeight(line * 3 + 14)
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send")
        self.send_button.setToolTip("Send (Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.setVisible(False)

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        # Under Send, not before the box: at 1024x700 a button on its left took a third of the box's width.
        buttons.addWidget(self.attach_button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.edit, 1)
        row.addLayout(buttons)
        fit = QHBoxLayout()
        fit.addWidget(self.fit_label, 1)
        fit.addWidget(self.first_part_button)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 6, 12, 10)
        outer.setSpacing(4)
        outer.addWidget(self.chips)
        outer.addLayout(row)
        outer.addWidget(self.attach_error)
        outer.addLayout(fit)

        self.edit.submitted.connect(self.submit)
        self.send_button.clicked.connect(self.submit)
        self.stop_button.clicked.connect(self.stop_requested)
        self.edit.textChanged.connect(self._update_buttons)
        self._update_buttons()

    def set_busy(self, busy: bool) -> None:
        """While generating, Send waits (the text stays) and Stop shows."""
        self._busy = busy
        self.stop_button.setVisible(busy)
        self._update_buttons()

    def set_blocked(self, reason: str | None) -> None:
        """While `reason` is set, Send is off and says why; the typed text stays (`SettingsState.constraint_problem`)."""
        self._blocked = reason
        self.send_button.setToolTip(f"Not sent: {reason}" if reason else "Send (Enter)")
        self._update_buttons()

    def _update_buttons(self) -> None:
        has_input = bool(self.edit.toPlainText().strip()) or bool(self.attachments)
        self.send_button.setEnabled(not self._busy and not self._blocked and has_input and not self.reading)

    def submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if not (text or self.attachments) or self._busy or self.reading:
            return  # (while files are read, Enter keeps the text: they go with it once read)
        if self._blocked:  # Enter while the constraint is invalid: keep the text, say why
            QToolTip.showText(self.send_button.mapToGlobal(self.send_button.rect().center()),
                              f"Not sent: {self._blocked}", self.send_button)
            return
        self._sent = list(self.attachments)
        self.edit.clear()
        self._set_attachments([])
        self.send_requested.emit(text)

    # -- attachments -----------------------------------------------------------------------

    def take_sent_attachments(self) -> list[documents.Attachment]:
        """The files that went with the text `send_requested` gave (once: a second call gets none)."""
        sent, self._sent = self._sent, []
        return sent

    def attach_files(self, paths: list[str]) -> None:
        """Attach each file that can be, in order, read off the UI thread where `off_thread` is set (Send waits
        meanwhile); the last problem is said under the box."""

        def read_all() -> list[documents.Attachment | documents.DocumentError]:
            out: list[documents.Attachment | documents.DocumentError] = []
            for path in paths:
                try:
                    out.append(documents.read_attachment(path))
                except documents.DocumentError as e:
                    out.append(e)
            return out

        def done(results: Any, error: BaseException | None) -> None:
            self.reading -= 1
            try:
                self._update_buttons()
            except RuntimeError:  # the window closed while the files were read: nothing to attach them to
                return
            self.attach_error.setVisible(False)
            if error is not None:  # a bug in the reader, not a file's problem: said, nothing attached
                self._say(f"Not attached: {type(error).__name__}: {error}")
                return
            for item in results or []:
                self._add(item)

        self.reading += 1
        self._update_buttons()
        names = ", ".join(Path(p).name for p in paths)
        self._say(f"Reading {names}…")
        if self.off_thread is None or not self.off_thread(read_all, done):
            done(read_all(), None)

    def attach_file(self, path: str) -> bool:
        """Read and check `path` now and show it as a chip; False (and one line saying why) if it cannot be
        attached. The file's text is read now: deleting it before sending does not change what is sent."""
        try:
            attachment = documents.read_attachment(path)
        except documents.DocumentError as e:
            return self._add(e)
        return self._add(attachment)

    def _say(self, text: str) -> None:
        self.attach_error.setText(text)
        self.attach_error.setVisible(True)

    def _add(self, attachment: documents.Attachment | documents.DocumentError) -> bool:
        if isinstance(attachment, documents.DocumentError):
            self._say(f"Not attached: {attachment}")
            return False
        self.attach_error.setVisible(False)
        if any(a.sha256 == attachment.sha256 for a in self.attachments):
            self.attach_error.setText(f"Not attached: {attachment.name} is attached already")
            self.attach_error.setVisible(True)
            return False
        self._set_attachments(self.attachments + [attachment])
        self._count(attachment)
        return True

    def add_attachment(self, attachment: documents.Attachment) -> None:
        """Attach an Attachment already read (the first part of one that did not fit)."""
        self._set_attachments(self.attachments + [attachment])
        self._count(attachment)

    def remove_attachment(self, sha256: str) -> None:
        self.tokens.pop(sha256, None)
        self._set_attachments([a for a in self.attachments if a.sha256 != sha256])

    def recount(self) -> None:
        """Count every chip's tokens again (another model, another tokenizer)."""
        for a in self.attachments:
            self._count(a)

    def set_attachment_tokens(self, sha256: str, tokens: int | None) -> None:
        if sha256 not in {a.sha256 for a in self.attachments}:
            return  # removed while it was counted
        self.tokens[sha256] = tokens
        chip = self.chips.chip(sha256)
        if chip is not None:
            chip.set_tokens(-1 if tokens is None and self.token_counter is None else tokens)
        self.attachments_changed.emit()

    def attachment_tokens(self) -> int | None:
        """The chips' tokens together; None while any is not counted."""
        counts = [self.tokens.get(a.sha256) for a in self.attachments]
        return None if any(n is None for n in counts) else sum(n for n in counts if n is not None)

    def set_fit_problem(self, text: str | None, can_send_first_part: bool = False) -> None:
        """Say (or stop saying) that the attachments do not fit the context, and by how much."""
        self.fit_label.setText(text or "")
        self.fit_label.setVisible(bool(text))
        self.first_part_button.setVisible(bool(text) and can_send_first_part)

    def _count(self, attachment: documents.Attachment) -> None:
        self.tokens[attachment.sha256] = None
        if self.token_counter is None:
            self.set_attachment_tokens(attachment.sha256, None)
            return
        sha = attachment.sha256

        def counted(n: int | None) -> None:
            self.set_attachment_tokens(sha, n)

        self.token_counter(attachment, counted)

    def _set_attachments(self, attachments: list[documents.Attachment]) -> None:
        self.attachments = attachments
        self.tokens = {a.sha256: self.tokens.get(a.sha256) for a in attachments}
        self.chips.set_attachments(attachments)
        for a in attachments:
            chip = self.chips.chip(a.sha256)
            if chip is not None and a.sha256 in self.tokens:
                chip.set_tokens(self.tokens[a.sha256] if self.token_counter is not None or self.tokens[a.sha256]
                                is not None else -1)
        if not attachments:
            self.set_fit_problem(None)
        self._update_buttons()
        self.attachments_changed.emit()
