"""The loom: the open answer's branches as a tree, with N continuations, auto-expand, step mode, export/import.

The tree is `app/state/loom_tree.py`'s, rebuilt (at most a few times a
second) when the conversation changes. Each row shows a node's tokens in
short, the path's log-probability and, at a fork, the probability no branch
has explored; its colour is the node's least likely token. Enter or a click
opens the node in the chat (its answer shown, its first token selected);
arrows move through the tree. Runs are the `LoomController`'s: the view asks
and draws.

A big group is read a slice at a time between the window's events (the
tree drawn so far stays until the new one is ready; a small one is drawn at
once), and rows are made as they are opened: the first `EAGER_ROWS` breadth
first (opened), the rest when their parent is expanded, by loops rather than
recursion. An imported tree of 2,000 answers, or one 1,100 forks deep
(600,000 tokens to read), froze the window for a minute and more when it
was read, and every row made and opened, at once (and the deep one then hit
Python's recursion limit).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import LoomAudit
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QComboBox, QDoubleSpinBox, QFileDialog, QGridLayout, QHBoxLayout, QHeaderView, QLabel, QProgressBar, QPushButton,
    QSpinBox, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget,
)

from app.controllers.loom import ExpandSettings, LoomController
from app.state.conversation import Conversation, Message
from app.state.loom_tree import LoomNode, answer_group, grow_tree, import_loom_file, representative, write_loom_file
from app.state.settings import Selection
from app.state.database.store import DatabaseBusy
from app.state.database.write_queue import write_queue
from app.widgets.fmt import pct
from app.widgets.heat import heat_color
from app.widgets.inspection.step_panel import StepPanel

log = logging.getLogger(__name__)
REBUILD_MS = 150  # tokens stream in: the tree is rebuilt at most this often
NODE = Qt.ItemDataRole.UserRole
FILLED = Qt.ItemDataRole.UserRole + 1  # the row's children rows have been made
EAGER_ROWS = 300  # rows made (and opened) when the tree is drawn; the others when their parent opens
TIP_CHARS = 300  # a row's tooltip quotes this much of its tokens' text
BUILD_SLICE_S = 0.04  # a big tree is read in slices this long, the window's events in between
BUILD_FIRST = 32  # answers read before the first slice may end: a small tree is drawn at once
READING = "Reading the branches"


@dataclass
class _Build:
    """A tree being read: its steps (`grow_tree`), where it has got to, and the node to keep selected."""

    steps: Iterator[LoomNode]
    answers: int
    keep: tuple[int, int] | None
    read: int = 0
    root: LoomNode | None = None


def _children(item: QTreeWidgetItem) -> list[QTreeWidgetItem]:
    """`item`'s child rows, in order."""
    out = []
    for i in range(item.childCount()):
        child = item.child(i)
        assert child is not None, "every index below childCount() holds a child row"
        out.append(child)
    return out


class LoomView(QWidget):
    def __init__(self, loom: LoomController, selection: Selection, parent: QWidget | None = None):
        super().__init__(parent)
        self._loom = loom
        self._library = loom.library
        self._selection = selection
        self._conv: Conversation | None = None
        self._root: LoomNode | None = None
        self._tasks: set[asyncio.Task] = set()
        self.last_audit: LoomAudit | None = None  # the latest audit of the loom rows
        self._audit_cancel: threading.Event | None = None  # set while an audit runs (its Stop)
        # The answer whose group the tree shows: kept during a loom run while the selection is gone for a moment
        # (a run's new children are each made the shown answer, then the shown one comes back; the inspector
        # lets go of its token meanwhile), so the tree does not jump to the conversation's last answer.
        self._shown_id: int | None = None
        # The token selected when a run started: given back when the run's children are in (see _on_children).
        self._run_selection: tuple[int, int] | None = None
        self.setAccessibleName("Loom")
        self._rebuild_timer = QTimer(self, singleShot=True, interval=REBUILD_MS)
        self._rebuild_timer.timeout.connect(self._on_rebuild_due)
        self._build: _Build | None = None  # the tree being read, if any
        self._build_again = False  # the state changed while it was read: read it again after
        self._build_timer = QTimer(self, singleShot=True, interval=0)
        self._build_timer.timeout.connect(self._build_slice)

        self._build_tree()
        self._build_continue_controls()
        self._build_expand_controls()
        self._build_run_and_file_buttons()
        self._lay_out()
        self._follow(loom, selection)
        self._on_conversation_changed(self._library.current)

    def _build_tree(self) -> None:
        """The branch tree: tokens, log p and unexplored; Enter or a click opens a row's node in the chat."""
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Tokens", "log p", "unexplored"])
        self.tree.setAccessibleName("Branch tree")
        self.tree.setUniformRowHeights(True)
        # The tokens are what a reader follows: their column takes the width the numbers leave, and a level
        # indents little, so a fork four levels down still shows its words in a 300 px dock.
        self.tree.setIndentation(10)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        # The numbers' columns are fitted to their rows when rows are made (`_fit_columns`), not kept fitted by
        # the header: that measured every open row again at each expansion (18 s to open a 1,100-deep branch).
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Interactive)
        self.tree.setToolTip("Enter or click opens a branch in the chat; arrows move through the tree")
        self.tree.itemActivated.connect(lambda item, _col: self.open_node(item.data(0, NODE)))
        self.tree.itemExpanded.connect(self._on_expanded)
        self.tree.itemClicked.connect(lambda item, _col: self.open_node(item.data(0, NODE)))

    def _build_continue_controls(self) -> None:
        """Continue ×N: how many, how they differ, how long."""
        self.n_spin = QSpinBox(minimum=2, maximum=16, value=4)
        self.n_spin.setAccessibleName("Number of continuations")
        self.mode = QComboBox()
        self.mode.setAccessibleName("How the continuations differ")
        self.mode.addItem("own seeds", "sample")
        self.mode.addItem("likeliest first tokens", "top")
        self.mode.addItem("beam search", "beam")
        self.mode.setToolTip("Own seeds: each child draws with its own seed (the seed + its row); a server that "
                             "samples and takes several choices per request draws all N from one seed.\n"
                             "Likeliest first tokens: child n starts with the model's nth most likely token, "
                             "then draws on.\nBeam search: the N most likely continuations as a whole (width N, "
                             "scored by mean log-probability), whatever the sampler would draw; each token is "
                             "marked forced")
        self.tokens_spin = QSpinBox(minimum=1, maximum=4096, value=32)
        self.tokens_spin.setAccessibleName("Tokens per continuation")
        self.continue_button = QPushButton("Continue ×N")
        self.continue_button.setToolTip("N alternatives to the token clicked in the chat (the inspector's), else to "
                                        "the selected branch, from one shared prefix, as one batch where the model can")
        self.continue_button.clicked.connect(self._on_continue_clicked)

    def _build_expand_controls(self) -> None:
        """Auto-expand: its entropy and min-p thresholds, depth and token budget."""
        self.entropy_spin = QDoubleSpinBox(minimum=0.0, maximum=12.0, value=1.5, singleStep=0.1)
        self.entropy_spin.setToolTip("Open forks whose entropy (nats) is at least this")
        self.entropy_spin.setAccessibleName("Entropy threshold")
        self.min_p_spin = QDoubleSpinBox(minimum=0.0, maximum=1.0, value=0.0, singleStep=0.05)
        self.min_p_spin.setSpecialValueText("off")
        self.min_p_spin.setAccessibleName("Min-p threshold")
        self.depth_spin = QSpinBox(minimum=1, maximum=8, value=2)
        self.depth_spin.setAccessibleName("Auto-expand depth")
        self.budget_spin = QSpinBox(minimum=8, maximum=100_000, value=512)
        self.budget_spin.setToolTip("New tokens auto-expand may make in all")
        self.budget_spin.setAccessibleName("Auto-expand token budget")
        self.expand_button = QPushButton("Auto-expand")
        self.expand_button.setToolTip("From the selected branch, open every fork whose entropy reaches the "
                                      "threshold (or, with min-p on, where two alternatives pass it)")
        self.expand_button.clicked.connect(self._on_expand_clicked)

    def _build_run_and_file_buttons(self) -> None:
        """A run's progress and Stop; Export, Import and Audit rows; the status line and step mode."""
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Loom progress")
        self.progress.setVisible(False)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self._on_stop_clicked)
        self.stop_button.setEnabled(False)
        self.export_button = QPushButton("Export…")
        self.export_button.clicked.connect(self._on_export_clicked)
        self.import_button = QPushButton("Import…")
        self.import_button.clicked.connect(self._on_import_clicked)
        self.audit_button = QPushButton("Audit rows")
        self.audit_button.setToolTip("Run this question's loom continuations again one by one, as single answers "
                                     "with the same seeds and settings, and report how far each row's log-probs moved")
        self.audit_button.clicked.connect(lambda: self.audit())
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.step_panel = StepPanel(self._loom)

    def _lay_out(self) -> None:
        """The tree on top, the controls' grid under it, then the run's row, the status, the file row, step mode."""
        grid = QGridLayout()
        for row, pairs in enumerate(((("N", self.n_spin), ("tokens", self.tokens_spin)),
                                     (("entropy ≥", self.entropy_spin), ("or min-p", self.min_p_spin)),
                                     (("depth", self.depth_spin), ("budget", self.budget_spin)))):
            for col, (label, widget) in enumerate(pairs):
                grid.addWidget(QLabel(label), 2 * row, 2 * col)
                grid.addWidget(widget, 2 * row, 2 * col + 1)
            if row == 0:
                grid.addWidget(self.mode, 1, 0, 1, 2)
                grid.addWidget(self.continue_button, 1, 2, 1, 2)
        grid.addWidget(self.expand_button, 5, 0, 1, 4)
        run_row = QHBoxLayout()
        run_row.addWidget(self.progress, 1)
        run_row.addWidget(self.stop_button)
        file_row = QHBoxLayout()
        file_row.addWidget(self.export_button)
        file_row.addWidget(self.import_button)
        file_row.addWidget(self.audit_button)
        file_row.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.tree, 1)
        lay.addLayout(grid)
        lay.addLayout(run_row)
        lay.addWidget(self.status)
        lay.addLayout(file_row)
        lay.addWidget(self.step_panel)

    def _follow(self, loom: LoomController, selection: Selection) -> None:
        """The conversation, the selection and the loom's runs redraw the tree and the status."""
        self._library.current_changed.connect(self._on_conversation_changed)
        selection.changed.connect(lambda *_: self._schedule())
        loom.busy_changed.connect(self._on_busy_changed)
        loom.children_added.connect(self._on_children)
        loom.progress.connect(self._on_progress)
        loom.error.connect(lambda text: self.status.setText(f"Loom: {text}"))
        loom.notice.connect(lambda text: self.status.setText(f"Loom: {text}"))
        loom.chat.busy_changed.connect(lambda _b: self._on_busy_changed(loom.busy))

    # -- the tree -------------------------------------------------------------------------------

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        if self._conv is not None:
            for sig in (self._conv.path_changed, self._conv.message_changed, self._conv.tokens_appended):
                sig.disconnect(self._schedule)
        self._conv = conv
        self._shown_id = None
        if conv is not None:
            for sig in (conv.path_changed, conv.message_changed, conv.tokens_appended):
                sig.connect(self._schedule)
        self.rebuild()

    def _schedule(self, *_args: object) -> None:
        if not self._rebuild_timer.isActive():
            self._rebuild_timer.start()

    def _focus_message(self) -> Message | None:
        """The answer whose group the tree shows: the selected token's; during a loom run, the group it showed
        (while its question is on screen); else the last answer on screen."""
        conv = self._conv
        if conv is None:
            return None
        if self._selection.message_id is not None and self._selection.message_id in conv.messages:
            m = conv.messages[self._selection.message_id]
            if m.is_assistant:
                return m
        path = conv.path()
        shown = conv.messages.get(self._shown_id) if self._shown_id is not None else None
        if (self._loom.busy and shown is not None and shown.parent_id is not None
                and conv.messages.get(shown.parent_id) in path):
            return conv.active_child(shown.parent_id) or shown  # the version on screen, of the same group
        return next((m for m in reversed(path) if m.is_assistant), None)

    def _on_children(self, _children: list[Message]) -> None:
        """A run's children exist: the token selected when it started is selected again. Each child was made the
        shown answer for a moment while it was added, so the inspector let go of the token (its answer had left
        the screen); the run itself shows the answer again."""
        kept, conv = self._run_selection, self._conv
        if kept is None or conv is None or self._selection.message_id is not None:
            return
        message = conv.messages.get(kept[0])
        if message is not None and message in conv.path() and kept[1] < len(conv.tokens(message)):
            self._selection.set(*kept)

    def _on_rebuild_due(self) -> None:
        if self._build is not None:
            self._build_again = True  # once the tree being read is drawn
        else:
            self.rebuild()

    @property
    def building(self) -> bool:
        """A big tree is being read (the one shown is the previous)."""
        return self._build is not None

    def rebuild(self) -> None:
        """Draw the tree of the focused answer's group again, keeping the current node where it still exists.

        A small group is drawn before this returns; a big one is read in slices between the window's events
        and drawn when it is whole (`building` until then)."""
        self._rebuild_timer.stop()
        self._build_timer.stop()
        self._build, self._build_again = None, False
        conv, focus = self._conv, self._focus_message()
        current = self.current_node()
        keep = (current.message_ids[0], current.start) if current is not None and current.message_ids else None
        if conv is None or focus is None:
            self.tree.clear()
            self._root = None
            self._update_buttons()
            return
        _question, answers = answer_group(conv, focus)
        self._shown_id = focus.id
        self._build = _Build(grow_tree(conv, answers), len(answers), keep)
        self._build_slice()

    def _build_slice(self) -> None:
        """Read the tree for a slice of time; draw it once whole, else come back after the window's events."""
        build = self._build
        if build is None:
            return
        t0, least = time.perf_counter(), BUILD_FIRST if build.read == 0 else 1
        n = 0
        for build.root in build.steps:
            n += 1
            if n >= least and time.perf_counter() - t0 > BUILD_SLICE_S:
                build.read += n
                self.status.setText(f"{READING}: {min(build.read, build.answers)} of {build.answers} answers…")
                self._build_timer.start()
                return
        self._build = None
        if self.status.text().startswith(READING):
            self.status.setText("")
        assert build.root is not None
        self._draw(build.root, build.answers, build.keep)
        if self._build_again:
            self._build_again = False
            self._schedule()

    def _draw(self, root: LoomNode, answers: int, keep: tuple[int, int] | None) -> None:
        self.tree.clear()
        self._root = root
        top = self._item(root)
        top.setText(0, f"{answers} answer{'s' * (answers != 1)}")
        self.tree.addTopLevelItem(top)
        self._open_first_rows(top)
        if keep is not None:
            node = root.find(*keep) if keep[1] >= 0 else None
            if node is not None and node.start == keep[1]:
                self._select(node)
        self._fit_columns()
        self._update_buttons()

    def _item(self, node: LoomNode) -> QTreeWidgetItem:
        """The row of `node`; its children's rows are made when it is opened (`_fill`)."""
        item = QTreeWidgetItem()
        item.setData(0, NODE, node)
        item.setText(0, node.short())
        item.setText(1, f"{node.path_logprob:.2f}")
        if node.unexplored_mass is not None:
            item.setText(2, pct(node.unexplored_mass))
        text = node.text()
        quoted = repr(text[:TIP_CHARS]) + (f"… ({len(text):,} characters)" if len(text) > TIP_CHARS else "")
        item.setToolTip(0, (f"{quoted}\nfirst token {pct(node.branch_prob)}, least likely {pct(node.min_prob)}; "
                            f"{len(node.message_ids)} answer(s) pass here"))
        if node.tokens:
            item.setBackground(0, heat_color(node.min_prob, self.palette().window().color().lightness() < 128))
        if node.children:
            item.setChildIndicatorPolicy(QTreeWidgetItem.ChildIndicatorPolicy.ShowIndicator)
        return item

    def _on_expanded(self, item: QTreeWidgetItem) -> None:
        if not item.data(0, FILLED):
            self._fill(item)
            self._fit_columns()

    def _fit_columns(self) -> None:
        for col in (1, 2):
            self.tree.resizeColumnToContents(col)

    def _fill(self, item: QTreeWidgetItem) -> None:
        """Make the rows of `item`'s children, once."""
        if item.data(0, FILLED):
            return
        item.setData(0, FILLED, True)
        node: LoomNode = item.data(0, NODE)
        item.addChildren([self._item(child) for child in node.children])

    def _open_first_rows(self, top: QTreeWidgetItem) -> None:
        """Make and open rows breadth first until `EAGER_ROWS` exist (a small tree opens whole)."""
        queue, made = deque([top]), 1
        while queue and made < EAGER_ROWS:
            item = queue.popleft()
            self._fill(item)
            item.setExpanded(True)
            made += item.childCount()
            queue.extend(_children(item))

    def current_node(self) -> LoomNode | None:
        item = self.tree.currentItem()
        return None if item is None else item.data(0, NODE)

    def _select(self, node: LoomNode) -> None:
        it = self._find_item(node)
        if it is not None:
            self._fit_columns()
            self.tree.setCurrentItem(it)

    def _find_item(self, node: LoomNode) -> QTreeWidgetItem | None:
        """`node`'s row, made (and its ancestors' rows opened) if it was not yet."""
        chain = []
        up: LoomNode | None = node
        while up is not None:
            chain.append(up)
            up = up.parent
        chain.reverse()
        item = self.tree.topLevelItem(0)
        if item is None or item.data(0, NODE) is not chain[0]:
            return None
        for below in chain[1:]:
            self._fill(item)
            item.setExpanded(True)
            found = next((child for child in _children(item) if child.data(0, NODE) is below), None)
            if found is None:
                return None
            item = found
        return item

    def items(self) -> list[QTreeWidgetItem]:
        """Every row made so far, depth first (for tests and keyboard checks)."""
        out: list[QTreeWidgetItem] = []
        stack = _children(self.tree.invisibleRootItem())[::-1]  # the top-level rows are its children
        while stack:
            it = stack.pop()
            out.append(it)
            stack.extend(_children(it)[::-1])
        return out

    def open_node(self, node: LoomNode | None) -> None:
        """Show `node`'s answer in the chat with the node's first token selected."""
        if node is None or self._conv is None or not node.message_ids:
            return
        message = representative(self._conv, node)
        conv = self._conv  # another connection holding the write lock: shown once it is free (write_queue.py)
        if not write_queue(self._library.store).run("showing the branch", lambda: conv.show(message),
                                                      atomic=False):
            return
        tokens = self._conv.tokens(message)
        if tokens:
            self._selection.set(message.id, min(node.start, len(tokens) - 1))

    # -- runs -----------------------------------------------------------------------------------

    def _anchor(self) -> tuple[Message, int] | None:
        """Where a run starts: the token clicked in the chat (the inspector's), else where the selected node
        starts (its N alternatives), so a run from a node never starts past an answer's end of text."""
        node, conv = self.current_node(), self._conv
        if conv is None:
            return None
        chosen = conv.messages.get(self._selection.message_id) if self._selection.message_id is not None else None
        if chosen is not None and chosen.is_assistant and self._selection.index is not None:
            return chosen, self._selection.index
        if node is not None and node.message_ids and node.tokens:
            return representative(conv, node), node.start
        return None

    def continuations_at(self, message: Message, index: int) -> asyncio.Task:
        """Ask the controller for N children at token `index` of `message` (the inspector's action too)."""
        return self._start(self._loom.continuations(
            message, index, self.n_spin.value(), self.mode.currentData(), self.tokens_spin.value()))

    def _start(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run a controller coroutine; a refusal (another run under way) is said in the status line."""
        sel = self._selection
        self._run_selection = (sel.message_id, sel.index) if sel.message_id is not None and sel.index is not None else None
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            self._run_selection = None
            if not t.cancelled() and t.exception() is not None:
                self.status.setText(f"Loom: {t.exception()}")

        task.add_done_callback(done)
        return task

    def _on_continue_clicked(self) -> None:
        anchor = self._anchor()
        if anchor is None:
            self.status.setText("Select a branch in the tree, or a token in the chat, to continue from")
            return
        self.continuations_at(*anchor)

    def expand_settings(self) -> ExpandSettings:
        min_p = self.min_p_spin.value()
        return ExpandSettings(entropy=self.entropy_spin.value(), min_p=min_p or None, depth=self.depth_spin.value(),
                              budget=self.budget_spin.value(), children=self.n_spin.value(),
                              tokens=self.tokens_spin.value())

    def _on_expand_clicked(self) -> asyncio.Task | None:
        anchor = self._anchor()
        if anchor is None:
            self.status.setText("Select a branch in the tree to expand from")
            return None
        try:
            how = self.expand_settings()
        except ValueError as e:
            self.status.setText(f"Loom: {e}")
            return None
        message, index = anchor
        return self._start(self._loom.auto_expand(message, index, how))

    def _on_busy_changed(self, busy: bool) -> None:
        self.progress.setVisible(busy)
        if busy:
            self.progress.setRange(0, 0)
            self.status.setText("")
        self._update_buttons()

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)

    def _update_buttons(self) -> None:
        idle = not self._loom.busy and not self._loom.chat.busy and self._audit_cancel is None
        for b in (self.continue_button, self.expand_button, self.import_button, self.audit_button):
            b.setEnabled(idle)
        self.export_button.setEnabled(self._root is not None and idle)
        self.stop_button.setEnabled(self._loom.busy or self._audit_cancel is not None)

    def audit(self) -> asyncio.Task:
        """Rerun the focused question's loom rows one by one; the report goes to the status line (app/controllers/loom_audit.py)."""
        from app.controllers.loom_audit import audit_question

        async def run() -> None:
            focus = self._focus_message()
            if self._conv is None or focus is None:
                raise ValueError("open a conversation with loom continuations to audit")
            self._audit_cancel = threading.Event()  # Stop sets it: the rerun under way ends before its next token
            self.audit_button.setEnabled(False)
            self.stop_button.setEnabled(True)
            self.status.setText("Audit: rerunning each row alone…")
            self.status.setToolTip("")

            def progress(done: int, total: int) -> None:
                self.progress.setVisible(True)
                self.progress.setRange(0, max(1, total))
                self.progress.setValue(done)
                self.progress.setFormat(f"Audit: row {min(done + 1, total)} of {total}")
                self.status.setText(f"Audit: rerunning row {min(done + 1, total)} of {total} alone…")

            try:
                self.last_audit = audit = await audit_question(self._loom.host, self._conv, focus,
                                                               cancel=self._audit_cancel, progress=progress)
            finally:
                self._audit_cancel = None
                self.progress.setVisible(self._loom.busy)
                self.progress.setFormat("%p%")
                self._update_buttons()
            # One line, so the tree keeps its room; each row's verdict is in the tooltip.
            self.status.setText("Audit: " + audit.summary())
            self.status.setToolTip("\n".join(audit.lines()))

        return self._start(run())

    def _on_stop_clicked(self) -> None:
        """Stop the loom's run, or the audit under way."""
        if self._audit_cancel is not None:
            self._audit_cancel.set()
            self.status.setText("Audit: stopping after this token…")
        self._loom.stop()

    # -- export and import ---------------------------------------------------------------------

    def export_to(self, path: str | Path) -> None:
        focus = self._focus_message()
        if self._conv is None or focus is None:
            raise ValueError("no answer to export: open a conversation with an answer")
        write_loom_file(path, self._conv, focus)  # standard JSON, whole or not at all (app/state/loom_tree.py)

    def import_from(self, path: str | Path) -> None:
        import_loom_file(self._library, path)  # checks the whole file, then one transaction (app/state/loom_import.py)

    def _on_export_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the loom tree", "loom.json", "JSON (*.json)")
        if path:
            self._report(lambda: self.export_to(path), f"Exported to {path}")

    def _on_import_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a loom tree", "", "JSON (*.json)")
        if path:
            self._report(lambda: self.import_from(path), "Imported as a new chat")

    def _report(self, action: Callable[[], object], done_text: str) -> None:
        try:
            action()
            self.status.setText(done_text)
        except DatabaseBusy:  # the import's one transaction could not start: nothing was written
            self.status.setText("Loom: not imported: the database is busy (another Logit Lab?); try again in a moment")
        except (OSError, ValueError) as e:
            self.status.setText(f"Loom: {e}")
