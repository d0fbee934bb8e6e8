"""The Structured output control: off, a JSON schema, a regular expression or a grammar, with an editor.

The text is checked as it is typed (after a short pause): a constraint that
cannot work shows the engine's one-line reason under the editor and is not
applied; one that can is put into the generation options
(`GenerationOptions.constraint`), so the next answer's `grammar` stage uses it.
A few examples fill the editor. See docs/constraints.md.
"""

from __future__ import annotations

import json
from dataclasses import replace

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QComboBox, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.state.settings import GenerationOptions, SettingsState
from engine import Constraint, ConstraintError

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
        self.status.setAccessibleName("Structured output status")
        col.addWidget(self.status)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(CHECK_DELAY_MS)
        self._timer.timeout.connect(self.apply)
        self._show(settings.options.constraint)
        self.mode.currentIndexChanged.connect(self._on_mode)
        self.editor.textChanged.connect(self._timer.start)
        self.examples.activated.connect(self._on_example)
        settings.changed.connect(self._on_settings_changed)

    # -- edits -> settings -----------------------------------------------------------------

    def apply(self) -> bool:
        """Check the editor's text now and apply it when it can work; False (the reason shown) when not."""
        self._timer.stop()
        kind = self.mode.currentData()
        constraint = None
        if kind is not None:
            try:
                constraint = Constraint(kind, self.editor.toPlainText())
            except ConstraintError as e:
                self._say(str(e), error=True)
                return False
        if constraint != self._settings.options.constraint:
            options: GenerationOptions = replace(self._settings.options, constraint=constraint)
            self._settings.set_options(options)
        self._say(f"on: answers must match this {constraint.label}" if constraint else "off")
        return True

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
        if options.constraint != self._current():
            self._show(options.constraint)

    def _current(self) -> Constraint | None:
        kind = self.mode.currentData()
        try:
            return Constraint(kind, self.editor.toPlainText()) if kind else None
        except ConstraintError:
            return None

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
        self._say(f"on: answers must match this {constraint.label}" if constraint else "off")

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet("color: #d9534f" if error else "color: palette(mid)")
