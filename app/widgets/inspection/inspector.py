"""The inspector: everything about the selected token, and branching from one of its alternatives.

It shows the message of the selected token (or, with nothing selected, the
last answer on screen) in the chart, so the chart grows live while an
answer streams.
"""

from __future__ import annotations

import html
import math

from engine import TokenEvent
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QTabWidget, QToolButton, QVBoxLayout, QWidget

from app.controllers.chat import ChatController
from app.state.conversation import Conversation, Message
from app.state.conversation_list import Library
from app.state.models.servers import server_samples
from app.state.settings import Selection
from app.widgets.chat.constraint_marks import constraint_summary, disallowed_reason, forced_badge
from app.widgets.fmt import bits, completed_character, pct, visible
from app.widgets.inspection.prob_table import ProbTable
from app.widgets.inspection.stage_view import StageView
from app.widgets.chat.token_button import TokenButton
from app.widgets.inspection.token_chart import TokenChart
from app.widgets.inspection.layer_view import LayerView
from app.widgets.steering.steering_effect_view import SteeringEffectView
from app.widgets.subscriptions import follow

BRANCH_TIP = (
    "Cut the answer before this token, use the selected alternative instead, and let the model go on "
    "(double-click an alternative does the same); the original answer is kept"
)
SERVER_BRANCH_TIP = (
    "Branching forces a token, which the server's own sampler cannot do: untick “The server samples” in the "
    "Sampling panel (we sample from the server's top-N) to branch"
)
SERVER_STAGES_TIP = (
    "The server sampled this answer: only its top-N log-probs are known, not what each of its sampler stages "
    "did. Answers written with “The server samples” off have the per-stage view"
)


MIN_WIDTH = 320  # px


class Inspector(QWidget):
    branch_requested = Signal(object, int, int)  # Message, token index, alternative token id
    continuations_requested = Signal(object, int)  # Message, token index: the loom's N children from there

    def __init__(self, library: Library, selection: Selection, controller: ChatController, parent: QWidget | None = None):
        super().__init__(parent)
        self._library = library
        self._selection = selection
        self._controller = controller
        self._conv: Conversation | None = None
        self._message: Message | None = None  # the message in the chart
        self.setAccessibleName("Token inspector")
        # Narrower than this, the table's token column and the chart's labels are cut off: when the window
        # shrinks (a layout saved at 1440 px opened at 1024), Qt then takes the width from the chat instead.
        self.setMinimumWidth(MIN_WIDTH)

        top = self._build_token_row()
        alternatives = self._build_alternatives()
        self._build_tabs(alternatives)

        self.chart = TokenChart()
        self.chart.index_clicked.connect(self._on_chart_clicked)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addLayout(top)
        lay.addWidget(self.metrics_label)
        lay.addWidget(self.tabs, 1)
        lay.addWidget(self.chart)

        library.current_changed.connect(self._on_conversation_changed)
        selection.changed.connect(self._on_selection_changed)
        controller.busy_changed.connect(lambda _busy: self._update_branch_button())
        controller.settings.changed.connect(self._on_sampling_mode_changed)
        follow(self, ((controller.host.model_changed, self._on_sampling_mode_changed),))  # the host outlives it
        self._on_conversation_changed(library.current)

    def _build_token_row(self) -> QHBoxLayout:
        """The selected token with its arrows (the row returned), and its statistics' line under it."""
        self.token_label = QLabel()
        self.token_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.token_label.setAccessibleName("Selected token")
        self.token_label.setTextFormat(Qt.TextFormat.RichText)  # our markup; every model-derived part is escaped
        # A long token and "token 38 of 125 · id 24484 forced" do not fit a 320 px dock on one line: they wrap
        # rather than lose "forced" under the arrows.
        self.token_label.setWordWrap(True)
        self.prev_button = QToolButton()
        self.prev_button.setText("◀")
        self.prev_button.setAccessibleName("Previous token")
        self.prev_button.setToolTip("Previous token (Alt+Left)")
        self.next_button = QToolButton()
        self.next_button.setText("▶")
        self.next_button.setAccessibleName("Next token")
        self.next_button.setToolTip("Next token (Alt+Right)")
        self.prev_button.clicked.connect(lambda: self.step(-1))
        self.next_button.clicked.connect(lambda: self.step(+1))
        top = QHBoxLayout()
        top.addWidget(self.token_label, 1)
        top.addWidget(self.prev_button)
        top.addWidget(self.next_button)
        self.metrics_label = QLabel()
        self.metrics_label.setWordWrap(True)
        self.metrics_label.setAccessibleName("Token statistics")
        self.metrics_label.setTextFormat(Qt.TextFormat.RichText)  # our markup; every number is escaped
        return top

    def _build_alternatives(self) -> QWidget:
        """The alternatives' table with Branch and N continuations under it."""
        self.table = ProbTable()
        self.branch_button = TokenButton("Branch from here", longest_verb="Branch with")
        self.branch_button.setAccessibleName("Branch with the selected alternative")
        self.branch_button.setToolTip(BRANCH_TIP)
        self.branch_button.clicked.connect(self._on_branch_clicked)
        self.table.branch_requested.connect(self._request_branch)
        self.table.currentItemChanged.connect(lambda *_: self._update_branch_button())
        self.continue_button = QPushButton("N continuations here")
        self.continue_button.setAccessibleName("N continuations from this token")
        self.continue_button.setToolTip("The loom: N new answers that keep the text before this token and each "
                                        "draw it and what follows anew (N and the length are set in the Loom panel)")
        self.continue_button.clicked.connect(self._request_continuations)
        alternatives = QWidget()
        alt_lay = QVBoxLayout(alternatives)
        alt_lay.setContentsMargins(0, 4, 0, 0)
        alt_lay.addWidget(self.table, 1)
        branch_row = QHBoxLayout()
        branch_row.addWidget(self.branch_button, 1)
        branch_row.addWidget(self.continue_button)
        alt_lay.addLayout(branch_row)
        return alternatives

    def _build_tabs(self, alternatives: QWidget) -> None:
        """The views' tabs: Alternatives, Sampler stages, Layers and Steering, each tab's whole name its tooltip."""
        self.stages = StageView()
        self.tabs = QTabWidget()
        self.tabs.addTab(alternatives, "Alternatives")
        self.tabs.addTab(self.stages, "Sampler stages")
        self.layer_view = LayerView(self._controller.host)  # computes only while its tab is open
        self.layer_view.index_clicked.connect(self._on_chart_clicked)
        self.tabs.addTab(self.layer_view, "Layers")
        self.steering_view = SteeringEffectView(self._controller.steering_jobs)  # "Without steering": on demand
        self.tabs.addTab(self.steering_view, "Steering")
        self.tabs.setAccessibleName("Inspector views")
        # A narrow inspector (320 px at 1024x700) shortens the tabs' names ("Sampler st…") rather than hiding
        # the last tab behind scroll arrows; each tab's tooltip has its whole name.
        self.tabs.setUsesScrollButtons(False)
        self.tabs.setElideMode(Qt.TextElideMode.ElideRight)
        for i in range(self.tabs.count()):
            if not self.tabs.tabToolTip(i):
                self.tabs.setTabToolTip(i, self.tabs.tabText(i))

    # -- what is shown ---------------------------------------------------------------------

    def selected_event(self) -> TokenEvent | None:
        m, i = self._selected_message(), self._selection.index
        if m is None or i is None or self._conv is None:
            return None
        tokens = self._conv.tokens(m)
        return tokens[i] if 0 <= i < len(tokens) else None

    def _selected_message(self) -> Message | None:
        if self._conv is None or self._selection.message_id is None:
            return None
        return self._conv.messages.get(self._selection.message_id)

    def _chart_message(self) -> Message | None:
        m = self._selected_message()
        if m is not None:
            return m
        if self._conv is None:
            return None
        answers = [x for x in self._conv.path() if x.is_assistant]
        return answers[-1] if answers else None

    def _refresh_chart(self) -> None:
        self._message = self._chart_message()
        self.chart.set_tokens(self._conv.tokens(self._message) if self._message and self._conv else [])
        self.chart.set_selected(self._selection.index if self._selected_message() else None)

    def _refresh_token(self) -> None:
        ev = self.selected_event()
        self.table.show_token(ev)
        self.stages.show_token(ev)
        self.layer_view.show_token(self._conv, self._selected_message(), self._selection.index if ev is not None else None)
        self.steering_view.show_token(self._conv, self._selected_message(), self._selection.index if ev is not None else None)
        self._update_stage_tab()
        has = ev is not None
        self.prev_button.setEnabled(has)
        self.next_button.setEnabled(has)
        self._update_header()
        self._update_branch_button()

    def _update_header(self) -> None:
        ev = self.selected_event()
        # A selected event means a conversation, its message and an index (selected_event reads all three).
        conv, message, index = self._conv, self._selected_message(), self._selection.index
        if ev is None or conv is None or message is None or index is None:
            self.token_label.setText("<span style='font-size:15px'><b>No token selected</b></span>")
            self.metrics_label.setText("Turn on the token view (Ctrl+H) and click a token, or click the chart below.")
            return
        n = len(conv.tokens(message))
        badges = "".join(f" <i>{html.escape(b)}</i>" for b, on in (("forced", ev.forced), ("end of sequence", ev.special),
                                                        (forced_badge(ev), bool(forced_badge(ev)))) if on)
        if ev.token_bytes is not None:  # a piece of a multi-byte character: its bytes, and the character
            character = completed_character(conv.tokens(message), index)
            badges += f" · bytes of “{html.escape(character)}”" if character else " · <i>part of a character</i>"
        self.token_label.setText(
            f"<span style='font-size:17px'><b><code>{html.escape(visible(ev.token_text, ev.token_bytes))}</code></b></span>"
            f"&nbsp;&nbsp;token {index + 1} of {n} · id {ev.token_id}{badges}"
        )
        # Every number goes in as text: pct() says "<0.1%", which rich text would read as a tag and drop.
        esc = html.escape
        sampler = pct(ev.sampler_prob) if math.isfinite(ev.sampler_logprob) else "cut (forced)"
        rest = next((p for p in ev.top_model if p.is_rest), None)
        # A server's top N only: the entropy counts the unreported rest as one outcome, a lower bound.
        entropy = f"≥ {ev.entropy:.2f}" if rest is not None else f"{ev.entropy:.2f}"
        self.metrics_label.setText(
            f"p(model) <b>{esc(pct(ev.prob))}</b> · p(sampler) <b>{esc(sampler)}</b> · rank <b>{ev.rank + 1}</b><br>"
            f"entropy <b>{esc(entropy)}</b> nats · surprisal <b>{esc(bits(ev.logprob))}</b>"
            + (f"<br>the server reported its top tokens only; the rest hold <b>{esc(pct(rest.prob))}</b>"
               if rest is not None else "")
            + (f"<br>{html.escape(constraint_summary(ev), quote=False)}" if ev.constraint is not None else "")
        )

    def _update_branch_button(self) -> None:
        ev = self.selected_event()
        token_id = self.table.selected_token()
        ok = ev is not None and token_id is not None and not self._controller.busy
        server = self._server_samples()
        refused = None  # why the answer's constraint does not allow the token here
        if ok and ev is not None and token_id is not None:
            refused = disallowed_reason(ev, token_id)
        self.branch_button.setEnabled(ok and not server and refused is None)
        self.continue_button.setEnabled(self.selected_event() is not None and not self._controller.busy)
        self.branch_button.setToolTip(SERVER_BRANCH_TIP if server else BRANCH_TIP)
        if ev is not None and token_id is not None:
            alt = next(
                (visible(p.text, p.token_bytes) for p in ev.top_model + ev.top_sampler if p.token_id == token_id),
                visible(ev.token_text, ev.token_bytes),
            )
            # Short words on the button (it shares a row with "N continuations here" in a narrow dock): the token
            # is cut to the button's width; its whole text and what the button does are in its tooltip.
            verb = "Resample" if token_id == ev.token_id else "Branch with"
            self.branch_button.set_token(verb, alt)
            whole = f"resample from here with “{alt}”" if token_id == ev.token_id else f"branch with “{alt}”"
            self.branch_button.setToolTip(f"{whole[0].upper()}{whole[1:]}: "
                                          f"{SERVER_BRANCH_TIP if server else BRANCH_TIP}")
        else:
            self.branch_button.set_plain("Branch from here")

    def _server_samples(self) -> bool:
        """The next generation is sampled by a server (so no forced tokens, hence no branching)."""
        return server_samples(self._controller.settings.options.server_sampling, self._controller.host.info)

    def _update_stage_tab(self) -> None:
        """The per-stage view is off for an answer the server sampled (with nothing selected: in that mode)."""
        m = self._selected_message()
        by_server = bool((m.request or {}).get("server_sampling")) if m is not None else self._server_samples()
        self.tabs.setTabEnabled(1, not by_server)
        self.tabs.setTabToolTip(1, SERVER_STAGES_TIP if by_server else self.tabs.tabText(1))
        if by_server and self.tabs.currentIndex() == 1:
            self.tabs.setCurrentIndex(0)

    def _on_sampling_mode_changed(self, *_args: object) -> None:
        self._update_stage_tab()
        self._update_branch_button()

    # -- state handlers --------------------------------------------------------------------

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        if self._conv is not None:
            self._conv.tokens_appended.disconnect(self._on_tokens_appended)
            self._conv.path_changed.disconnect(self._on_path_changed)
            self._conv.message_changed.disconnect(self._on_message_changed)
        self._conv = conv
        if conv is not None:
            conv.tokens_appended.connect(self._on_tokens_appended)
            conv.path_changed.connect(self._on_path_changed)
            conv.message_changed.connect(self._on_message_changed)
        self._selection.clear()
        self._refresh_chart()
        self._refresh_token()

    def _on_selection_changed(self, _message_id: int | None, _index: int | None) -> None:
        if self._chart_message() is not self._message:
            self._refresh_chart()
        else:
            self.chart.set_selected(self._selection.index if self._selected_message() else None)
        self._refresh_token()

    def _on_tokens_appended(self, message: Message, start: int) -> None:
        if message is self._message and self._conv is not None:
            tokens = self._conv.tokens(message)
            self.chart.append(tokens[self.chart.count :])
            i = self._selection.index
            if message.id == self._selection.message_id and i is not None:
                if start <= i < len(tokens):
                    self._refresh_token()  # the selected token just arrived (the forced token of a branch)
                else:
                    self._update_header()  # "token 41 of N" grows with the answer

    def _on_message_changed(self, message: Message) -> None:
        if message is self._message or self._chart_message() is not self._message:
            self._refresh_chart()

    def _on_path_changed(self) -> None:
        m = self._selected_message()
        if m is not None and self._conv is not None and m not in self._conv.path():
            self._selection.clear()  # its message is on a branch no longer shown
        else:
            self._refresh_chart()

    def _on_chart_clicked(self, index: int) -> None:
        if self._message is not None:
            self._selection.set(self._message.id, index)

    def step(self, offset: int) -> None:
        """Select the previous/next token of the same message (with none selected: the chart's first)."""
        if self._conv is None:
            return
        m = self._selected_message()
        if m is None or self._selection.index is None:
            m = self._chart_message()
            if m is not None and self._conv.tokens(m):
                self._selection.set(m.id, 0)
            return
        i = max(0, min(len(self._conv.tokens(m)) - 1, self._selection.index + offset))
        self._selection.set(m.id, i)

    # -- branching -------------------------------------------------------------------------

    def _on_branch_clicked(self) -> None:
        token_id = self.table.selected_token()
        if token_id is not None:
            self._request_branch(token_id)

    def _request_continuations(self) -> None:
        m, i = self._selected_message(), self._selection.index
        if m is not None and i is not None and not self._controller.busy:
            self.continuations_requested.emit(m, i)

    def _request_branch(self, token_id: int) -> None:
        m, i = self._selected_message(), self._selection.index
        if token_id < 0:  # the "rest" of a server's distribution is no one token
            return
        if m is not None and i is not None and not self._controller.busy and not self._server_samples():
            self.branch_requested.emit(m, i, token_id)
