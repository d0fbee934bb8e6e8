"""One message in the chat: header (who, model, "2 / 3" sibling arrows, actions), the answer's Thinking
block, body, footer (stats), and where the other versions' later messages are.

An answer that reasons (`<think>…</think>`, or the markers its model names:
`engine.reasoning`, read as saved with the answer) shows its reasoning in a
collapsible Thinking block and the rest in the body. In the token view the
block holds the answer's first `_content_start` tokens and the body the rest;
a token index in a signal or a selection is always the answer's own.
"""

from __future__ import annotations

import html

from engine import TokenEvent, reasoning

from PySide6.QtCore import QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.state.conversation import Conversation, Message
from app.state.versions import elsewhere
from app.widgets.chat.attachment_chips import ChipRow
from app.widgets.chat.composer import MessageEdit
from app.widgets.chat.message_body import MessageBody
from app.widgets.chat.thinking_block import ThinkingBlock
from app.widgets.tool_calls.tool_call_block import ToolCallsArea
from app.widgets.chat.version_note import VersionNote, header_button
from app.controllers.steering_shadows import SteeringShadows
from app.widgets.steering.shadow_status import ShadowStatus
from app.widgets.subscriptions import follow

FINISH_TEXT = {
    "eos": "",
    "stop": "ended at a stop string",
    "length": "cut off at the length limit",
    "cancelled": "stopped",
    "client": "sent by the client (served: no token records)",  # app/controllers/served_conversations.py
    None: "interrupted",
}


class _ModelName(QLabel):
    """The model's name, shortened with "…" to the room the header's buttons leave (its tooltip has it whole)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)  # a model's name comes from a file or a server: never markup
        self.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        # Ignored: the buttons keep their full labels; the name takes what is left, and paintEvent elides it.
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        # Qt renders a tooltip that looks like HTML as HTML: escaped inside a paragraph, the name shows as typed.
        self.setToolTip(f"<p>{html.escape(text)}</p>")

    def paintEvent(self, _event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        p = QPainter(self)
        p.setPen(self.palette().color(self.foregroundRole()))
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.width())
        p.drawText(self.rect(), int(Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft), text)


CONTINUE_TIP = "Continue: generate more of this cut-off answer"
CONTINUE_NEW_VERSION_TIP = ("Continue: generate more of this cut-off answer as a new version of it; the later "
                            "messages stay with this version, which keeps its text")


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
        self._shadows: SteeringShadows | None = None  # the "steering" colouring's KL per token, on demand
        self._busy = False
        self._has_thinking = False  # the rendered layout: a Thinking block above the body
        self._content_start = 0  # token view: the body shows the answer's tokens from here on
        self._format: tuple[object, reasoning.ReasoningFormat] = (None, reasoning.ReasoningFormat())
        self._start_cache: tuple[object, int] = (None, 0)  # ((content offset, token list), first content token)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        who = "You" if message.role == "user" else "Assistant"
        self.setAccessibleName(f"{who} message")

        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 8, 14, 8)
        outer.setSpacing(2)
        self._build_header(outer, who)
        self._build_body(outer, who)
        self._build_editor(outer)
        self._build_footer(outer)
        self.refresh()

    def _build_header(self, outer: QVBoxLayout, who: str) -> None:
        """Who wrote it and with which model, the version arrows, Edit, Regenerate, More and Copy."""
        header = QHBoxLayout()
        header.setSpacing(4)
        self.role_label = QLabel(f"<b>{who}</b>")
        self.model_label = _ModelName()  # a server names its model: painted as text, never markup
        header.addWidget(self.role_label)
        header.addWidget(self.model_label, 1)  # takes the room left, so the buttons keep theirs
        self.prev_button = header_button("‹", "Previous version of this message", "Previous version")
        self.sibling_label = QLabel()
        self.sibling_label.setAccessibleName("Version")
        self.next_button = header_button("›", "Next version of this message", "Next version")
        self.prev_button.clicked.connect(lambda: self.sibling_requested.emit(self.message, -1))
        self.next_button.clicked.connect(lambda: self.sibling_requested.emit(self.message, +1))
        for w in (self.prev_button, self.sibling_label, self.next_button):
            header.addWidget(w)
        header.addSpacing(8)
        self.edit_button = header_button("Edit", "Edit this message and send it again (keeps the original as a branch)", "Edit")
        # Short labels (the tooltip says what each does): with the version arrows they fit a 380 px chat column.
        self.regen_button = header_button("↻", "Regenerate: write a new answer (Ctrl+R); the old one stays as a branch",
                                  "Regenerate")
        self.continue_button = header_button("More", CONTINUE_TIP, "Continue")
        self.copy_button = header_button("Copy", "Copy the text of this message", "Copy")
        self.edit_button.clicked.connect(self._begin_edit)
        self.regen_button.clicked.connect(lambda: self.regenerate_requested.emit(self.message))
        self.continue_button.clicked.connect(lambda: self.continue_requested.emit(self.message))
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.copy_text()))
        for w in (self.edit_button, self.regen_button, self.continue_button, self.copy_button):
            header.addWidget(w)
        outer.addLayout(header)

    def _build_body(self, outer: QVBoxLayout, who: str) -> None:
        """The thinking block, the steering-effect status, the text, and the files sent with it."""
        self.thinking = ThinkingBlock(self)
        self.thinking.setVisible(False)
        self.thinking.body.token_clicked.connect(lambda i: self.token_clicked.emit(self.message, i))
        outer.addWidget(self.thinking)

        # "Steering effect: computing… 128/512 tokens [Stop]", or why the answer is not coloured in that mode.
        self.shadow_status = ShadowStatus(self)
        outer.addWidget(self.shadow_status)

        self.body = MessageBody(self)
        if self.message.role == "user":
            self.body.set_background_role(QPalette.ColorRole.AlternateBase)
        self.body.setAccessibleName(f"{who} text")
        self.body.token_clicked.connect(lambda i: self.token_clicked.emit(self.message, self._content_start + i))
        outer.addWidget(self.body)
        self.tool_calls = ToolCallsArea(self.conv, self.message, self)  # each tool call as a block (tool_call_block.py)
        outer.addWidget(self.tool_calls)
        # The files sent with a question, as chips (name, size): the body shows what the user typed; the model
        # read the files' blocks before it (Message.model_text).
        self.attachment_chips = ChipRow(removable=False, parent=self)
        self.attachment_chips.set_attachments(list(self.message.attachments))
        outer.addWidget(self.attachment_chips)

    def _build_editor(self, outer: QVBoxLayout) -> None:
        """The editor an Edit opens in place of the text, with Cancel and Send."""
        self.editor = MessageEdit(self)  # Enter or Ctrl+Enter sends, Shift+Enter a new line, Esc cancels
        self.editor.setAccessibleName("Edit message")
        self.editor.submitted.connect(lambda: self._submit_edit())
        self.editor.cancelled.connect(lambda: self._end_edit())
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

    def _build_footer(self, outer: QVBoxLayout) -> None:
        """The answer's statistics, and the note on later messages that are on another version."""
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
        self.footer.setWordWrap(True)  # a narrow chat column wraps the stats rather than cutting them
        outer.addWidget(self.footer)

        # "3 later messages are on version 1 ‹ ›": the turns that followed another version are one click away.
        self.version_note = VersionNote(self)
        self.version_note.switch_requested.connect(lambda offset: self.sibling_requested.emit(self.message, offset))
        outer.addWidget(self.version_note)

    # -- rendering -------------------------------------------------------------------------

    def set_view(self, heatmap: bool, heat_mode: str, dark: bool) -> None:
        if (heatmap, heat_mode, dark) != (self._heatmap, self._heat_mode, self._dark):
            self._heatmap, self._heat_mode, self._dark = heatmap, heat_mode, dark
            self._render_body()
            self._update_shadow_status()

    def set_shadows(self, shadows: SteeringShadows) -> None:
        """Where the "Steering effect" colouring gets its KL per token (computed when first shown)."""
        self._shadows = shadows
        follow(self, ((shadows.ready, self._on_shadow_ready),  # the shadows outlive this widget
                      (shadows.progressed, self._on_shadow_progress)))
        self._update_shadow_status()

    def _steering_mode(self) -> bool:
        return self._heatmap and self._heat_mode == "steering"

    def _on_shadow_ready(self, message_id: int) -> None:
        if message_id == self.message.id and self._steering_mode():
            self._render_body()
            self._update_shadow_status()

    def _on_shadow_progress(self, message_id: int) -> None:
        if message_id == self.message.id:
            self._update_shadow_status()

    def _update_shadow_status(self) -> None:
        self.shadow_status.show_state(self._shadows, self.conv, self.message, self._steering_mode())

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.update_chrome()

    def refresh(self) -> None:
        """Bring body and chrome up to date with the message (cheap when nothing changed)."""
        self._sync_body()
        self.tool_calls.refresh()
        self.update_chrome()

    def _split(self, text: str) -> reasoning.ReasoningSplit:
        """The answer's text cut into reasoning and content, read the way its model writes reasoning."""
        doc = (self.message.request or {}).get("reasoning")
        if self._format[0] is not doc:
            self._format = (doc, reasoning.ReasoningFormat.from_dict(doc))
        return reasoning.split_reasoning(text, self._format[1], complete=not self.message.generating)

    def _token_split(self, tokens: list[TokenEvent]) -> tuple[bool, int]:
        """(has a Thinking block, index of the first content token) for the token view.

        The text split is a few string searches; the walk over the tokens to find where the content
        starts runs once per answer (the close marker, once there, stays where it is as tokens come).
        """
        split = self._split(self.message.content)  # the tokens' texts joined
        if not split.has_reasoning:
            return False, len(tokens) if split.pending else 0
        if not split.finished:
            return True, len(tokens)
        key = (split.content_offset, id(tokens))
        if self._start_cache[0] != key:
            self._start_cache = (key, reasoning.content_token([t.text for t in tokens], split))
        return True, self._start_cache[1]

    def _body_mode(self) -> str:
        """How the body shows the message: plain (the user's), tokens (the token view), or Markdown."""
        m = self.message
        if m.role == "user":
            return "plain"
        if not self._heatmap:
            return "markdown"
        if not m.generating and m.content and not self.conv.tokens(m):
            return "markdown"  # text without token records (an imported loom's earlier answers): its text
        return "tokens"

    def _render_body(self) -> None:
        """Render the body from scratch (the view mode or palette changed)."""
        m = self.message
        self._content_start = 0
        mode = self._body_mode()
        if mode == "plain":
            self._show_thinking(False)
            self.body.show_plain(m.content)
        elif mode == "tokens":
            tokens = self.conv.tokens(m)
            steered = self._shadows is not None and self._heat_mode == "steering"
            kl = self._shadows.kl(self.conv, m) if steered and self._shadows is not None else None
            # the bodies hold a plain list of floats (what model_diff_view gives them too), not the shadow's array
            self.body.steering_kl = self.thinking.body.steering_kl = (
                None if kl is None else [float(x) for x in kl])
            has, self._content_start = self._token_split(tokens)
            self._show_thinking(has)
            self.thinking.set_muted(False)
            if has:
                self.thinking.body.show_tokens(tokens[: self._content_start], self._heat_mode, self._dark)
            self.body.show_tokens(tokens[self._content_start :], self._heat_mode, self._dark)
        else:
            split = self._split(m.content)
            self._show_thinking(split.has_reasoning)
            self.thinking.set_muted(True)
            if split.has_reasoning:
                self.thinking.body.show_markdown(split.reasoning)
            self.body.show_markdown(split.content)
        self._update_thinking_state()

    def _show_thinking(self, has: bool) -> None:
        self._has_thinking = has
        self.thinking.setVisible(has)
        if not has:
            self.thinking.body.show_plain("")

    def _sync_body(self) -> None:
        """Show what the body lacks. Tokens and text of a message only ever grow, so this appends."""
        m = self.message
        want = self._body_mode()
        if self.body.mode != want:
            self._render_body()
        elif want == "plain":
            if self.body.rendered_text != m.content:
                self.body.show_plain(m.content)
        elif want == "tokens":
            self._sync_tokens()
        else:
            self._sync_markdown()
        if not m.generating:
            self.body.finish()
            self.thinking.body.finish()
            if (want == "tokens" and self._heat_mode == "steering" and self._shadows is not None
                    and self.body.steering_kl is None):
                self._shadows.kl(self.conv, m)  # a steered answer just ended: coloured once its shadow is ready
        self._update_thinking_state()

    def _sync_tokens(self) -> None:
        tokens = self.conv.tokens(self.message)
        has, start = self._token_split(tokens)
        shown_thinking = self.thinking.body.rendered_tokens if self._has_thinking else 0
        shown_body = self.body.rendered_tokens
        if (has != self._has_thinking or start < shown_thinking or (shown_body and start != self._content_start)
                or start + shown_body > len(tokens)):
            self._render_body()  # the block appeared, closed earlier than shown, or the tokens were replaced
            return
        if has:
            self.thinking.body.append_tokens(tokens[shown_thinking:start])
        self._content_start = start
        self.body.append_tokens(tokens[start + shown_body :])

    def _sync_markdown(self) -> None:
        split = self._split(self.message.content)
        if split.has_reasoning != self._has_thinking:
            self._render_body()
            return
        parts = [(self.body, split.content)]
        if split.has_reasoning:
            parts.append((self.thinking.body, split.reasoning))
        for body, text in parts:
            if text.startswith(body.rendered_text):
                body.append_text(text[len(body.rendered_text) :])
            else:
                body.show_markdown(text)

    def _update_thinking_state(self) -> None:
        if not self._has_thinking:
            return
        m = self.message
        open_ = m.generating and not self._split(m.content).finished
        n: int | None
        if self.body.mode == "tokens":
            n = self._content_start
        else:  # counted once the answer is done (a walk over its tokens)
            n = None if m.generating else self._token_split(self.conv.tokens(m))[1]
        self.thinking.set_state(open_, n)

    def copy_text(self) -> str:
        """What Copy copies: the answer without its reasoning (the message's text for a user message)."""
        m = self.message
        if not m.is_assistant:
            return m.content
        split = self._split(m.content)
        return split.content if split.has_reasoning else m.content

    def on_tokens_appended(self) -> None:
        """Streaming: show what arrived since the last call (the footer's count a few times a second)."""
        self._sync_body()
        if not self._footer_timer.isActive():
            self._footer_timer.start()

    def set_selected(self, index: int | None) -> None:
        """Highlight token `index` of the answer (None: none), in the Thinking block when it is one of its."""
        if index is not None and self._has_thinking and index < self._content_start:
            self.thinking.set_expanded(True)
            self.thinking.body.set_selected(index)
            self.body.set_selected(None)
        else:
            self.thinking.body.set_selected(None)
            self.body.set_selected(None if index is None else index - self._content_start)

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
        if self.continue_button.isVisibleTo(self):  # later turns build on this text: it is continued as a new version
            later = self.conv.active_child(m.id) is not None
            self.continue_button.setToolTip(CONTINUE_NEW_VERSION_TIP if later else CONTINUE_TIP)
        for b in (self.edit_button, self.regen_button, self.continue_button):
            b.setEnabled(not self._busy)
        self._update_footer()
        if many:
            i = sibs.index(m)
            self.version_note.show_note(elsewhere(self.conv, m), i > 0, i < len(sibs) - 1, not self._busy)
        else:
            self.version_note.show_note(None, False, False, False)
        self._update_shadow_status()

    def _update_footer(self) -> None:
        m = self.message
        # Fields saved with a wrong type (an older version's import) are read as absent; say which and why.
        note = f"cannot show all of this message ({m.unreadable})" if m.unreadable else ""
        if not m.is_assistant:
            self.footer.setText(note)
            self.footer.setVisible(bool(note))
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
        if note:
            parts.append(note)
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

    def paintEvent(self, event: QPaintEvent) -> None:
        if self.message.role == "user":
            p = QPainter(self)
            p.setRenderHint(QPainter.RenderHint.Antialiasing)
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(self.palette().color(QPalette.ColorRole.AlternateBase))
            p.drawRoundedRect(QRectF(self.rect()).adjusted(1, 1, -1, -1), 10, 10)
        super().paintEvent(event)
