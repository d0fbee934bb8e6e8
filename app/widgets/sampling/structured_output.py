"""The Structured output control: off, a JSON schema, a regular expression or a grammar, with an editor.

The text is checked as it is typed (after a short pause), off the UI thread
(`app.controllers.off_thread.start_off_thread`, on a small pool of its own): building a grammar is llguidance's work and can take a second (sizes
past `engine.constraints.limits` are refused in words before it starts), and
the window must not wait for it. A constraint that cannot work shows the
engine's one-line reason under the editor and is not applied; one that can is
put into the generation options (`GenerationOptions.constraint`), so the next
answer's `grammar` stage uses it. Until the text is checked and valid, nothing
is sent (`SettingsState.constraint_problem` says why): an answer never goes
out under the previous constraint while the editor shows another.
A few examples fill the editor. See docs/constraints.md.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import math

from PySide6.QtCore import QPointF, QSize, Qt, QTimer
from PySide6.QtGui import QFontDatabase, QPainter, QPaintEvent, QResizeEvent, QTextLayout, QTextOption
from PySide6.QtWidgets import QComboBox, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QSizePolicy, QVBoxLayout, QWidget
from shiboken6 import isValid

from app.controllers.off_thread import start_off_thread

from app.state.settings import GenerationOptions, SettingsState
from engine import CONSTRAINT_KINDS, Constraint, ConstraintError

# (label in the selector, constraint kind); "gbnf" reads GBNF (root ::= ...) and Lark (start: ...) alike.
MODES: tuple[tuple[str, str | None], ...] = (("Off", None), ("JSON schema", "json_schema"),
                                              ("Regex", "regex"), ("Grammar", "gbnf"))
EXAMPLES: dict[str, tuple[str, str]] = {
    "A person (JSON schema)": ("json_schema", json.dumps({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                       "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["name", "age"], "additionalProperties": False}, indent=2)),
    "Yes or no, then a reason (regex)": ("regex", r"(Yes|No)\. Because [^\n.]{5,80}\."),
    "A list of three items (GBNF)": ("gbnf", 'root ::= item item item\nitem ::= "- " [^\\n]{1,40} "\\n"'),
}
CHECK_DELAY_MS = 400
# Where checks run: two, so that a slow build (a second or more) does not hold up the check of the text typed next.
_CHECKS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="logitlab-constraint-check")


class WrappedLabel(QLabel):
    """A plain-text label that wraps at word boundaries, and inside a word too long for a line.

    A grammar's error quotes the rule it cannot find ('undefined_rule_with_a_long_name…'): QLabel's word wrap
    never breaks a word, so the label asked for the word's width, widened the sampling panel past its dock and
    was cut off. This one asks for a few characters of width and as many lines as its width needs."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(True)  # height for width, as Qt's own wrapped labels
        policy = QSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)

    def _layout(self, width: int) -> tuple[QTextLayout, float]:
        # A line separator, not "\n", is how QTextLayout breaks a line.
        layout = QTextLayout(self.text().replace("\n", "\u2028"), self.font())
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        layout.setTextOption(option)
        layout.beginLayout()
        height = 0.0
        while True:
            line = layout.createLine()
            if not line.isValid():
                break
            line.setLineWidth(max(1, width))
            line.setPosition(QPointF(0, height))
            height += line.height()
        layout.endLayout()
        return layout, height

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt's name
        margins = self.contentsMargins()
        inner = width - margins.left() - margins.right()
        return math.ceil(self._layout(inner)[1]) + margins.top() + margins.bottom() if self.text() else 0

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt's name
        return True

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        width = max(self.width(), self.minimumSizeHint().width())
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().averageCharWidth() * 8, self.heightForWidth(max(1, self.width())))

    def paintEvent(self, _event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        rect = self.contentsRect()
        layout, _height = self._layout(rect.width())
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        layout.draw(painter, QPointF(rect.left(), rect.top()))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if self.height() < self.heightForWidth(self.width()):
            self.updateGeometry()  # more lines at this width: ask the layout for them


class StructuredOutputBox(QGroupBox):
    """Structured output: choose the kind, edit the text; a valid constraint goes to the settings."""

    def __init__(self, settings: SettingsState, parent: QWidget | None = None) -> None:
        super().__init__("Structured output", parent)
        self._settings = settings
        col = QVBoxLayout(self)
        row = QHBoxLayout()
        self.mode = QComboBox()
        self.mode.setAccessibleName("Structured output kind")
        for label, kind in MODES:
            self.mode.addItem(label, kind)
        self.examples = QComboBox()
        self.examples.setAccessibleName("Structured output examples")
        self.examples.addItem("Examples…")
        self.examples.addItems(list(EXAMPLES))
        for combo in (self.mode, self.examples):  # long example names must not widen the sampling panel
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(5)
        row.addWidget(self.mode, 1)
        row.addWidget(self.examples, 1)
        col.addLayout(row)
        self.editor = QPlainTextEdit()
        self.editor.setAccessibleName("Structured output text")
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setPlaceholderText("a JSON schema, a regular expression, or a GBNF / Lark grammar")
        self.editor.setMaximumHeight(160)
        col.addWidget(self.editor)
        self.status = WrappedLabel()  # plain text (a grammar's error quotes its text: never markup), wrapped anywhere
        self.status.setAccessibleName("Structured output status")
        col.addWidget(self.status)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(CHECK_DELAY_MS)
        self._timer.timeout.connect(self.apply)
        self._job = 0  # the check running now (its number), 0 if none: a newer check makes an older one's result moot
        self._jobs = 0  # checks started so far
        self.valid: bool | None = True  # the editor's text as last checked: usable, refused, or None while checking
        self._show(settings.options.constraint)
        self.mode.currentIndexChanged.connect(self._on_mode)
        self.editor.textChanged.connect(self._on_edited)
        self.examples.activated.connect(self._on_example)
        settings.changed.connect(self._on_settings_changed)

    # -- edits -> settings -----------------------------------------------------------------

    @property
    def checking(self) -> bool:
        """A check of the editor's text is under way (or waiting for the typing to pause)."""
        return self._job != 0 or self._timer.isActive()

    def apply(self) -> None:
        """Check the editor's text off the UI thread; it is applied, or its reason shown, when the check ends.

        Until then sending waits (`SettingsState.constraint_problem`); `valid` is None meanwhile.
        """
        self._timer.stop()
        kind = self.mode.currentData()
        if kind is None:  # off: nothing to build
            self._job = 0
            self._finish(None, None)
            return
        self.valid = None
        self._settings.set_constraint_problem(f"the {_kind_label(kind)} is still being checked")
        self._say("checking…")
        self._jobs += 1
        self._job = job = self._jobs
        text = self.editor.toPlainText()
        # The work holds the kind and the text only, never this box; the box is called back on the loop.
        if not start_off_thread(lambda: _check(kind, text), lambda result, error: self._checked(job, result, error),
                                executor=_CHECKS):
            self._checked(job, _check(kind, text), None)  # no event loop to come back to (never in the app): here

    def _checked(self, job: int, result: tuple[Constraint | None, str | None] | None,
                 error: BaseException | None) -> None:
        """On the loop: check number `job` ended (its result is moot if a newer one started, or the box is gone)."""
        if not isValid(self) or job != self._job:
            return
        self._job = 0
        if result is None:  # _check itself failed (it turns every refusal into words): say so all the same
            result = (None, f"the constraint cannot be checked: {error}")
        self._finish(*result)

    def _finish(self, constraint: Constraint | None, error: str | None) -> None:
        if error is not None:
            self.valid = False
            self._say(error, error=True)
            self._settings.set_constraint_problem(error)
            return
        self.valid = True
        if constraint != self._settings.options.constraint:
            options: GenerationOptions = replace(self._settings.options, constraint=constraint)
            self._settings.set_options(options)
        self._settings.set_constraint_problem(None)
        self._say(f"on: answers must match this {constraint.label}" if constraint else "off")

    def _on_edited(self) -> None:
        if self.mode.currentData() is not None:  # not sendable until the new text is checked
            self.valid = None
            self._settings.set_constraint_problem(f"the {_kind_label(self.mode.currentData())} is still being checked")
        self._timer.start()


    def _on_mode(self) -> None:
        self.editor.setEnabled(self.mode.currentData() is not None)
        self.apply()

    def _on_example(self, index: int) -> None:
        if index <= 0:
            return
        kind, text = EXAMPLES[self.examples.itemText(index)]
        self.examples.setCurrentIndex(0)
        self.mode.blockSignals(True)
        self.mode.setCurrentIndex(next(i for i, (_, k) in enumerate(MODES) if k == kind))
        self.mode.blockSignals(False)
        self.editor.setEnabled(True)
        self.editor.setPlainText(text)
        self.apply()

    # -- settings -> view ------------------------------------------------------------------

    def _on_settings_changed(self, options: GenerationOptions) -> None:
        if not self.checking and self.valid and not _shows(options.constraint, self.mode.currentData(),
                                                           self.editor.toPlainText()):
            self._show(options.constraint)  # set elsewhere (a preset, an imported setup): show it

    def _show(self, constraint: Constraint | None) -> None:
        kind = "gbnf" if constraint is not None and constraint.kind == "lark" else (constraint.kind if constraint else None)
        index = next((i for i, (_, k) in enumerate(MODES) if k == kind), 0)
        for w in (self.mode, self.editor):
            w.blockSignals(True)
        self.mode.setCurrentIndex(index)
        self.editor.setPlainText(constraint.text if constraint is not None else "")
        self.editor.setEnabled(kind is not None)
        for w in (self.mode, self.editor):
            w.blockSignals(False)
        self._timer.stop()
        self._job = 0
        self.valid = True
        self._settings.set_constraint_problem(None)
        self._say(f"on: answers must match this {constraint.label}" if constraint else "off")

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet("color: #d9534f" if error else "color: palette(mid)")


def _shows(constraint: Constraint | None, kind: str | None, text: str) -> bool:
    """Whether the editor (its `kind` and `text`) already shows `constraint`."""
    if constraint is None:
        return kind is None
    shown_kind = "gbnf" if constraint.kind == "lark" else constraint.kind
    return kind == shown_kind and text == constraint.text


def _check(kind: str, text: str) -> tuple[Constraint | None, str | None]:
    """Off the UI thread: the `Constraint` of `text` (llguidance, possibly a second or more), or why it cannot work."""
    try:
        return Constraint(kind, text), None
    except ConstraintError as e:
        return None, str(e)
    except Exception as e:  # anything else llguidance raises is a refusal too, never a lost window
        return None, f"the {_kind_label(kind)} cannot be used: {e}"


def _kind_label(kind: str) -> str:
    """The kind in words; "gbnf" is the Grammar mode, which reads GBNF and Lark alike."""
    return "grammar" if kind == "gbnf" else CONSTRAINT_KINDS.get(kind, kind)
