"""One message in the chat: header (who, model, "2 / 3" sibling arrows, actions), body, footer (stats)."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QPainter, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.state.conversation import Conversation, Message
from app.widgets.message_body import MessageBody

FINISH_TEXT = {
    "eos": "",
    "stop": "ended at a stop string",
    "length": "cut off at the length limit",
    "cancelled": "stopped",
    None: "interrupted",
}


def _tool(text: str, tip: str, name: str) -> QToolButton:
    b = QToolButton()
    b.setText(text)
    b.setToolTip(tip)
    b.setAccessibleName(name)
    b.setAutoRaise(True)
    b.setCursor(Qt.CursorShape.PointingHandCursor)
    return b


class MessageWidget(QFrame):
    regenerate_requested = Signal(object)  # Message
    continue_requested = Signal(object)  # Message
    edit_submitted = Signal(object, str)  # Message, new text
    sibling_requested = Signal(object, int)  # Message, -1 | +1
    token_clicked = Signal(object, int)  # Message, token index

    def __init__(self, conv: Conversation, message: Message, parent: QWidget | None = None):
        super().__init__(parent)
        self.conv = conv
        self.message = message
        self._heatmap = False
        self._heat_mode = "probability"
        self._dark = False
        self._busy = False
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        who = "You" if message.role == "user" else "Assistant"
        self.setAccessibleName(f"{who} message")

        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 8, 14, 8)
        outer.setSpacing(2)

        header = QHBoxLayout()
        header.setSpacing(4)
        self.role_label = QLabel(f"<b>{who}</b>")
        self.model_label = QLabel()
        self.model_label.setTextFormat(Qt.TextFormat.PlainText)  # a server names its model: text, never markup
        self.model_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        header.addWidget(self.role_label)
        header.addWidget(self.model_label)
        header.addStretch(1)
        self.prev_button = _tool("‹", "Previous version of this message", "Previous version")
        self.sibling_label = QLabel()
        self.sibling_label.setAccessibleName("Version")
        self.next_button = _tool("›", "Next version of this message", "Next version")
        self.prev_button.clicked.connect(lambda: self.sibling_requested.emit(self.message, -1))
        self.next_button.clicked.connect(lambda: self.sibling_requested.emit(self.message, +1))
        for w in (self.prev_button, self.sibling_label, self.next_button):
            header.addWidget(w)
        header.addSpacing(8)
        self.edit_button = _tool("Edit", "Edit this message and send it again (keeps the original as a branch)", "Edit")
        self.regen_button = _tool("Regenerate", "Write a new answer (Ctrl+R); the old one stays as a branch", "Regenerate")
        self.continue_button = _tool("Continue", "Generate more of this cut-off answer", "Continue")
        self.copy_button = _tool("Copy", "Copy the text of this message", "Copy")
        self.edit_button.clicked.connect(self._begin_edit)
        self.regen_button.clicked.connect(lambda: self.regenerate_requested.emit(self.message))
        self.continue_button.clicked.connect(lambda: self.continue_requested.emit(self.message))
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.message.content))
        for w in (self.edit_button, self.regen_button, self.continue_button, self.copy_button):
            header.addWidget(w)
        outer.addLayout(header)

        self.body = MessageBody(self)
        if message.role == "user":
            self.body.set_background_role(QPalette.ColorRole.AlternateBase)
        self.body.setAccessibleName(f"{who} text")
        self.body.token_clicked.connect(lambda i: self.token_clicked.emit(self.message, i))
        outer.addWidget(self.body)

        self.editor = QPlainTextEdit(self)
        self.editor.setAccessibleName("Edit message")
        self.editor.setVisible(False)
        self.editor_buttons = QWidget(self)
        eb = QHBoxLayout(self.editor_buttons)
        eb.setContentsMargins(0, 0, 0, 0)
        eb.addStretch(1)
        self.edit_cancel = QPushButton("Cancel")
        self.edit_send = QPushButton("Send")
        self.edit_send.setDefault(True)
        self.edit_cancel.clicked.connect(self._end_edit)
        self.edit_send.clicked.connect(self._submit_edit)
        eb.addWidget(self.edit_cancel)
        eb.addWidget(self.edit_send)
        self.editor_buttons.setVisible(False)
        outer.addWidget(self.editor)
        outer.addWidget(self.editor_buttons)

        # The live token count is relabelled at most every 250 ms: a label's text change relayouts
        # the message, and per token that is work taken from the decode thread on small machines.
        self._footer_timer = QTimer(self)
        self._footer_timer.setSingleShot(True)
        self._footer_timer.setInterval(250)
        self._footer_timer.timeout.connect(self._update_footer)
        self.footer = QLabel()
        self.footer.setTextFormat(Qt.TextFormat.PlainText)  # an error may quote a server's HTML page
        self.footer.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.footer.setAccessibleName("Answer statistics")
        outer.addWidget(self.footer)

        self.refresh()

    # -- rendering -------------------------------------------------------------------------

    def set_view(self, heatmap: bool, heat_mode: str, dark: bool) -> None:
        if (heatmap, heat_mode, dark) != (self._heatmap, self._heat_mode, self._dark):
            self._heatmap, self._heat_mode, self._dark = heatmap, heat_mode, dark
            self._render_body()

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.update_chrome()

    def refresh(self) -> None:
        """Bring body and chrome up to date with the message (cheap when nothing changed)."""
        self._sync_body()
        self.update_chrome()

    def _render_body(self) -> None:
        """Render the body from scratch (the view mode or palette changed)."""
        m = self.message
        if m.role == "user":
            self.body.show_plain(m.content)
        elif self._heatmap:
            self.body.show_tokens(self.conv.tokens(m), self._heat_mode, self._dark)
        else:
            self.body.show_markdown(m.content)

    def _sync_body(self) -> None:
        """Show what the body lacks. Tokens and text of a message only ever grow, so this appends."""
        m = self.message
        want = "plain" if m.role == "user" else ("tokens" if self._heatmap else "markdown")
        if self.body.mode != want:
            self._render_body()
        elif want == "plain":
            if self.body.rendered_text != m.content:
                self.body.show_plain(m.content)
        elif want == "tokens":
            tokens = self.conv.tokens(m)
            if self.body.rendered_tokens <= len(tokens):
                self.body.append_tokens(tokens[self.body.rendered_tokens :])
            else:
                self._render_body()
        elif m.content.startswith(self.body.rendered_text):
            self.body.append_text(m.content[len(self.body.rendered_text) :])
        else:
            self._render_body()
        if not m.generating:
            self.body.finish()

    def on_tokens_appended(self) -> None:
        """Streaming: show what arrived since the last call (the footer's count a few times a second)."""
        self._sync_body()
        if not self._footer_timer.isActive():
            self._footer_timer.start()

    def set_selected(self, index: int | None) -> None:
        self.body.set_selected(index)

    def update_chrome(self) -> None:
        m = self.message
        sibs = self.conv.siblings(m)
        many = len(sibs) > 1
        for w in (self.prev_button, self.sibling_label, self.next_button):
            w.setVisible(many)
        if many:
            i = sibs.index(m)
            self.sibling_label.setText(f"{i + 1} / {len(sibs)}")
            self.prev_button.setEnabled(i > 0 and not self._busy)
            self.next_button.setEnabled(i < len(sibs) - 1 and not self._busy)
        if m.is_assistant and m.model:
            self.model_label.setText(m.model.get("name", ""))
        self.edit_button.setVisible(m.role == "user")
        self.regen_button.setVisible(m.is_assistant)
        self.continue_button.setVisible(m.can_continue and bool(m.content or self.conv.tokens(m)))
        for b in (self.edit_button, self.regen_button, self.continue_button):
            b.setEnabled(not self._busy)
        self._update_footer()

    def _update_footer(self) -> None:
        m = self.message
        if not m.is_assistant:
            self.footer.setVisible(False)
            return
        parts: list[str] = []
        if m.branch_index is not None:
            parts.append(f"branched at token {m.branch_index + 1}")
        if m.generating:
            n = len(m.tokens or ())
            parts.append(f"generating… {n} tokens" if n else "waiting for the model…")
        elif m.finish_reason == "error":
            parts.append("error: " + str((m.stats or {}).get("error", "unknown")))
        else:
            st = m.stats or {}
            if st.get("generated_tokens"):
                parts.append(f"{len(self.conv.tokens(m))} tokens")
                if st.get("decode_tokens_per_s"):
                    parts.append(f"{st['decode_tokens_per_s']:.1f} tok/s")
                parts.append(f"first token {st.get('time_to_first_token_s', 0):.2f} s")
            reason = FINISH_TEXT.get(m.finish_reason, m.finish_reason or "")
            if reason:
                parts.append(reason)
        self.footer.setText(" · ".join(parts))
        self.footer.setVisible(bool(parts))

    # -- editing a user message --------------------------------------------------------------

    def _begin_edit(self) -> None:
        self.editor.setPlainText(self.message.content)
        self.body.setVisible(False)
        self.editor.setVisible(True)
        self.editor_buttons.setVisible(True)
        self.editor.setFocus()

    def _end_edit(self) -> None:
        self.editor.setVisible(False)
        self.editor_buttons.setVisible(False)
        self.body.setVisible(True)

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText().strip()
        if text and not self._busy:
            self._end_edit()
            self.edit_submitted.emit(self.message, text)

    # -- look ------------------------------------------------------------------------------

    def paintEvent(self, event) -> None:
        if self.message.role == "user":
            p = QPainter(self)
            p.setRenderHint(QPainter.RenderHint.Antialiasing)
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(self.palette().color(QPalette.ColorRole.AlternateBase))
            p.drawRoundedRect(QRectF(self.rect()).adjusted(1, 1, -1, -1), 10, 10)
        super().paintEvent(event)
