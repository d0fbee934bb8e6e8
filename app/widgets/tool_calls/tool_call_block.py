"""Each tool call of an answer as a collapsible block under its text: the tool, its arguments, what the model
decided (engine.call_confidence over the answer's own token records), the result, and the branches.

Collapsed it is one line ("▸ Tool call · get_weather · call 83 %"). Open, it says:
- "call: 0.4 % vs answering in text 99.6 %": the model's own probability of beginning the call at the
  decision token, [Answer instead] branches there with a text token;
- the tool's name with the model's probability and, labelled apart, its share among the allowed names
  (a share, not the model's probability), [Call another tool] branches at the name token;
- per argument its value's probability and weakest token, the alternatives at its first token on hover,
  [Other value] branches there;
- the result: typed by hand (a sampling experiment), Continue sends it back as a `tool` message; or the one
  an MCP tool gave, with the approval. A result is untrusted text: shown as plain text (never HTML, no links
  opened), cut to a size limit (app/state/tool_settings.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from engine import CallConfidence, TokenProb

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.state.tool_settings import MAX_RESULT_CHARS, ToolResult, tool_results
from app.widgets.tool_calls.tool_approval import ApprovalRow
from app.tool_calls.branch_points import other_names, text_alternatives, value_alternatives
from app.tool_calls.calls import confidences

if TYPE_CHECKING:
    from app.controllers.tool_calls import ToolCallActions
    from app.state.conversation import Conversation, Message

SHOWN_RESULT_CHARS = 2_000  # of a result, in the block (the whole kept text goes to the model)
APPROVAL_TEXT = {"once": "allowed once by you", "always": "always allowed for this tool", "denied": "denied by you"}


def pct(p: float) -> str:
    """A probability as a percentage a person reads: 83 %, 0.4 %, <0.1 %."""
    if p >= 0.995:
        return f"{p * 100:.1f} %" if p < 0.9995 else "100 %"
    if p >= 0.1:
        return f"{p * 100:.0f} %"
    if p >= 0.001:
        return f"{p * 100:.1f} %"
    return "<0.1 %"


def _plain(text: str = "", name: str = "", wrap: bool = True) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)  # model and tool text: never markup, never a link
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setWordWrap(wrap)
    if name:
        label.setAccessibleName(name)
    return label


def _alternatives_tip(at: str, alts: list[TokenProb]) -> str:
    shown = "\n".join(f"  {t.text!r}  {pct(t.prob)}" for t in alts) or "  (none listed)"
    return f"The model's alternatives at {at!r} (its own probabilities):\n{shown}"


def _menu_button(text: str, tip: str, name: str) -> QToolButton:
    b = QToolButton()
    # The style's menu indicator is drawn over the text's last letter (Fusion: "Call another too"+arrow): an
    # arrow in the text instead, the indicator hidden.
    b.setText(f"{text} ▾")
    b.setStyleSheet("QToolButton::menu-indicator { image: none; width: 0px; }")
    b.setToolTip(tip)
    b.setAccessibleName(name)
    b.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
    b.setMenu(QMenu(b))
    return b


class ToolCallBlock(QFrame):
    """One call: built from its `CallConfidence`; `actions` (None: read-only) runs its buttons."""

    def __init__(self, conv: "Conversation", message: "Message", conf: CallConfidence,
                 actions: "ToolCallActions | None", parent: QWidget | None = None):
        super().__init__(parent)
        self.conv, self.message, self.conf, self.call_actions = conv, message, conf, actions
        self.setObjectName("tool_call_block")
        self.setAccessibleName(f"Tool call {conf.call.name}")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 6)
        layout.setSpacing(3)
        self.toggle = QToolButton(self)
        self.toggle.setCheckable(True)
        self.toggle.setChecked(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setAccessibleName("Show tool call")
        self.toggle.toggled.connect(self._on_toggled)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.inner = QWidget(self)
        inner = QVBoxLayout(self.inner)
        inner.setContentsMargins(12, 0, 0, 0)
        inner.setSpacing(3)
        layout.addWidget(self.inner)
        self._build_decision(inner)
        self._build_name(inner)
        self._build_arguments(inner)
        self._build_result(inner)
        self.error_label = _plain(name="Tool call error")
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.setVisible(False)
        inner.addWidget(self.error_label)
        self._update_toggle()
        self.show_result()

    # -- the parts -------------------------------------------------------------------------

    def _row(self, layout: QVBoxLayout, label: QLabel, button: QToolButton | None) -> None:
        row = QHBoxLayout()
        row.addWidget(label, 1)
        if button is not None:
            row.addWidget(button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(row)

    def _build_decision(self, layout: QVBoxLayout) -> None:
        d = self.conf.decision
        if d is None:
            self.decision_label = _plain("call: not shown (the answer's records do not hold its decision)", "Call decision")
            self.answer_button = None
            layout.addWidget(self.decision_label)
            return
        self.decision_label = _plain(
            f"call: {pct(d.call_prob)} vs answering in text {pct(d.text_prob)}  "
            f"(the model's own probability at token {d.token.index + 1} {d.token.text!r})", "Call decision")
        self.decision_label.setToolTip(_alternatives_tip(d.token.text, sorted(d.alternatives, key=lambda t: -t.logprob)[:8]))
        self.answer_button = _menu_button("Answer instead", "Branch at the decision token with a text token "
                                          "(a new version of this answer; the chat's cache is reused)", "Answer instead")
        for t in text_alternatives(self.conf, self.conv.tokens(self.message)):
            self.answer_button.menu().addAction(f"{t.text!r}  {pct(t.prob)}", partial(self._answer_instead, t.token_id))
        self.answer_button.setEnabled(self.call_actions is not None and not self.answer_button.menu().isEmpty())
        self._row(layout, self.decision_label, self.answer_button)

    def _build_name(self, layout: QVBoxLayout) -> None:
        n = self.conf.name
        call = self.conf.call
        if n is None:
            self.name_label = _plain(f"tool: {call.name}", "Tool name")
            self.other_tool_button = None
            layout.addWidget(self.name_label)
            return
        mine = next(o for o in n.options if o.name == call.name)
        others = "; ".join(f"{o.name} {pct(o.model_prob) if o.listed else '<' + pct(n.floor)}"
                           for o in n.options if o.name != call.name)
        self.name_label = _plain(
            f"tool: {call.name} · the model's probability {pct(mine.model_prob)} · "
            f"share among the allowed names {pct(mine.share_of_allowed)} (a share, not the model's probability)"
            + (f"\nothers (the model's probability): {others}" if others else ""), "Tool name")
        self.other_tool_button = _menu_button("Call another tool", "Branch at the name token, calling another "
                                              "allowed tool", "Call another tool")
        for name in other_names(self.conf):
            self.other_tool_button.menu().addAction(name, partial(self._other_tool, name))
        self.other_tool_button.setEnabled(self.call_actions is not None and not self.other_tool_button.menu().isEmpty())
        self._row(layout, self.name_label, self.other_tool_button)

    def _build_arguments(self, layout: QVBoxLayout) -> None:
        self.argument_labels: dict[str, QLabel] = {}
        self.value_buttons: dict[str, QToolButton] = {}
        args = {a.name: a for a in self.conf.arguments}
        try:
            values = self.conf.call.parsed_arguments()
        except ValueError:
            values = {}
        if not values:
            layout.addWidget(_plain(f"arguments: {self.conf.call.arguments}", "Arguments"))
        tokens = self.conv.tokens(self.message)
        for key, value in values.items():
            a = args.get(key)
            shown = str(a.value if a is not None else value)
            if a is None:
                label = _plain(f"{key} = {shown}", f"Argument {key}")
                layout.addWidget(label)
                self.argument_labels[key] = label
                continue
            label = _plain(f"{key} = {shown[:200]} · value {pct(a.prob)} · weakest {a.weakest.text!r} "
                           f"{pct(a.weakest.prob)}", f"Argument {key}")
            first = tokens[a.first.index] if a.first.index < len(tokens) else None
            alts = value_alternatives(first, a.alternatives) if first is not None else []
            label.setToolTip(_alternatives_tip(a.first.text, sorted(a.alternatives, key=lambda t: -t.logprob)[:8]))
            button = _menu_button("Other value", f"Branch at {a.first.text!r} with another token the model had there",
                                  f"Other value for {key}")
            for t in alts:
                button.menu().addAction(f"{t.text!r}  {pct(t.prob)}", partial(self._other_value, a.first.index, t.token_id))
            button.setEnabled(self.call_actions is not None and bool(alts))
            self._row(layout, label, button)
            self.argument_labels[key] = label
            self.value_buttons[key] = button

    def _build_result(self, layout: QVBoxLayout) -> None:
        self.result_label = _plain(name="Tool result")
        self.result_label.setForegroundRole(QPalette.ColorRole.Text)
        layout.addWidget(self.result_label)
        self.result_edit = QPlainTextEdit()
        self.result_edit.setAccessibleName("Type the tool's result")
        self.result_edit.setPlaceholderText("Type what the tool returned, then Continue: what would the model do "
                                            "if the tool said this?")
        self.result_edit.setMaximumHeight(70)
        self.continue_button = QPushButton("Continue")
        self.continue_button.setToolTip("Send this as the tool's result (a tool message) and let the model go on")
        self.continue_button.clicked.connect(self._continue)
        row = QHBoxLayout()
        row.addWidget(self.result_edit, 1)
        row.addWidget(self.continue_button, 0, Qt.AlignmentFlag.AlignBottom)
        self.result_row = QWidget()
        self.result_row.setLayout(row)
        row.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.result_row)
        self.approval: ApprovalRow | None = None  # an MCP call's Allow / Always / Deny (app/widgets/tool_calls/tool_approval.py)
        self._approval_at = layout

    # -- state -----------------------------------------------------------------------------

    def result(self) -> ToolResult | None:
        if self.call_actions is None:
            return None
        return tool_results(self.call_actions.store, self.message.id).get(self.conf.call.id)

    def show_result(self) -> None:
        """The result given to the call (escaped, its start only), or the box to type one."""
        r = self.result()
        self._show_approval(r is None)
        self.result_row.setVisible(r is None and self.call_actions is not None)
        self.continue_button.setEnabled(r is None)
        if r is None:
            self.result_label.setText("result: none yet" if self.call_actions is not None else "result: none")
            return
        who = {"typed": "typed by you", "mcp": "from the tool", "denied": "none: the call was denied"}.get(r.source, r.source)
        approval = f" · {APPROVAL_TEXT[r.approval]}" if r.approval in APPROVAL_TEXT else ""
        text = r.text if len(r.text) <= SHOWN_RESULT_CHARS else r.text[:SHOWN_RESULT_CHARS] + " …"
        notes = (" · an error" if r.is_error else "") + (" · cut to the size limit" if r.truncated else "")
        self.result_label.setText(f"result ({who}{approval}{notes}):\n{text}" if r.source != "denied"
                                  else f"result: {who}{approval}")
        self._update_toggle()

    def _show_approval(self, waiting: bool) -> None:
        """An MCP tool's call without a result: ask (or say it runs, or the step limit); else no row."""
        loop = self.call_actions.loop if self.call_actions is not None else None
        call = self.conf.call
        if loop is None or not waiting or not loop.is_mcp(call):
            if self.approval is not None:
                self.approval.setVisible(False)
            return
        if self.approval is None:
            a = self.call_actions
            assert a is not None
            self.approval = ApprovalRow(call.name, loop.mcp.server_name(call.name),
                                        lambda d: self._run(loop.decide(self.message, call, d)), loop.stop, self)
            self._approval_at.insertWidget(self._approval_at.indexOf(self.result_row), self.approval)
        self.approval.setVisible(True)
        self.approval.show_state(loop.state.get((self.message.id, call.id)))

    def _update_toggle(self) -> None:
        arrow = "▾" if self.toggle.isChecked() else "▸"
        d = self.conf.decision
        call = f" · call {pct(d.call_prob)}" if d is not None else ""
        self.toggle.setText(f"{arrow} Tool call · {self.conf.call.name}{call}")

    def _on_toggled(self, open_: bool) -> None:
        self.inner.setVisible(open_)
        self._update_toggle()

    # -- actions ---------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, object]) -> asyncio.Task | None:
        if self.call_actions is None:
            return None
        self.error_label.setVisible(False)
        task = self.call_actions.spawn(coro)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        try:
            self.error_label.setText(f"Not done: {task.exception()}")
            self.error_label.setVisible(True)
        except RuntimeError:  # the block was deleted meanwhile (the chat redrawn)
            pass

    def _continue(self) -> asyncio.Task | None:
        text = self.result_edit.toPlainText()
        if not text.strip() or self.call_actions is None:
            return None
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS]
        return self._run(self.call_actions.continue_with_result(self.message, self.conf.call.id, text))

    def _answer_instead(self, token_id: int) -> asyncio.Task | None:
        """"Answer instead" with `token_id`, a text token the model had at the decision point."""
        a = self.call_actions
        return self._run(a.answer_instead(self.message, self.conf, token_id)) if a is not None else None

    def _other_tool(self, name: str) -> asyncio.Task | None:
        a = self.call_actions
        return self._run(a.call_other_tool(self.message, self.conf, name)) if a is not None else None

    def _other_value(self, index: int, token_id: int) -> asyncio.Task | None:
        a = self.call_actions
        return self._run(a.other_value(self.message, index, token_id)) if a is not None else None


class ToolCallsArea(QWidget):
    """The blocks of one answer's calls (hidden while it has none); rebuilt when the answer's calls change."""

    def __init__(self, conv: "Conversation", message: "Message", parent: QWidget | None = None):
        super().__init__(parent)
        self.conv, self.message = conv, message
        self.call_actions: ToolCallActions | None = None
        self.blocks: list[ToolCallBlock] = []
        self._shown: tuple[object, ...] = ()
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 2, 0, 2)
        self.setVisible(False)

    def set_actions(self, actions: "ToolCallActions | None") -> None:
        self.call_actions = actions
        self._shown = ()
        self.refresh()

    def refresh(self) -> None:
        m = self.message
        key = (m.stats and tuple(str(c) for c in m.stats.get("tool_calls") or ()), m.generating, self.call_actions)
        if key == self._shown:
            for b in self.blocks:
                b.show_result()
            return
        self._shown = key
        for b in self.blocks:
            b.deleteLater()
        self.blocks = []
        if m.generating or not m.is_assistant:
            self.setVisible(False)
            return
        for conf in confidences(self.conv, m):
            block = ToolCallBlock(self.conv, m, conf, self.call_actions, self)
            self._layout.addWidget(block)
            self.blocks.append(block)
        self.setVisible(bool(self.blocks))
