"""The Structured output control: off, a JSON schema, a regular expression or a grammar, with an editor.

The text is checked as it is typed (after a short pause), on a thread of its
own: building a grammar is llguidance's work and can take a second (sizes
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
import threading
from dataclasses import replace

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QComboBox, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

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
POLL_MS = 25  # how often a running check is looked at (the thread cannot touch widgets itself)


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
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # a grammar's error quotes its text: never markup
        self.status.setAccessibleName("Structured output status")
        col.addWidget(self.status)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(CHECK_DELAY_MS)
        self._timer.timeout.connect(self.apply)
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_MS)
        self._poll.timeout.connect(self._on_poll)
        self._job: _Check | None = None  # the check running now, if any
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
        return self._job is not None or self._timer.isActive()

    def apply(self) -> None:
        """Check the editor's text off the UI thread; it is applied, or its reason shown, when the check ends.

        Until then sending waits (`SettingsState.constraint_problem`); `valid` is None meanwhile.
        """
        self._timer.stop()
        kind = self.mode.currentData()
        if kind is None:  # off: nothing to build
            self._job = None
            self._poll.stop()
            self._finish(None, None)
            return
        self.valid = None
        self._settings.set_constraint_problem(f"the {_kind_label(kind)} is still being checked")
        self._say("checking…")
        self._job = _Check(kind, self.editor.toPlainText())  # a newer check makes an older one's result moot
        self._poll.start()

    def _on_poll(self) -> None:
        job = self._job
        if job is None:
            self._poll.stop()
            return
        if not job.done.is_set():
            return
        self._job = None
        self._poll.stop()
        self._finish(job.constraint, job.error)

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
        self._job = None
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


class _Check:
    """One check of a constraint's text, on a thread of its own; `done` is set when it ends.

    The thread builds the `Constraint` (llguidance, possibly a second or more) and writes only its own
    attributes; the box reads them on the UI thread once `done` is set.
    """

    def __init__(self, kind: str, text: str) -> None:
        self.constraint: Constraint | None = None
        self.error: str | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(kind, text), name="logitlab-constraint-check", daemon=True).start()

    def _run(self, kind: str, text: str) -> None:
        try:
            self.constraint = Constraint(kind, text)
        except ConstraintError as e:
            self.error = str(e)
        except Exception as e:  # anything else llguidance raises is a refusal too, never a lost window
            self.error = f"the {_kind_label(kind)} cannot be used: {e}"
        finally:
            self.done.set()



def _kind_label(kind: str) -> str:
    """The kind in words; "gbnf" is the Grammar mode, which reads GBNF and Lark alike."""
    return "grammar" if kind == "gbnf" else CONSTRAINT_KINDS.get(kind, kind)
