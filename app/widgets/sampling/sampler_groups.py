"""The samplers beyond the classic ones, in folding sections: dynamic temperature and top-nσ, DRY, mirostat,
adaptive-p, smoothing, logit bias and banned strings.

Sections start folded so the panel fits a small window; a section whose
sampler is on says so in its header, folded or not. Numbers are `ParamRow`s
(the panel treats them like its own rows: same edits, same server limits);
the three lists are text boxes applied when they lose focus (or when the panel
flushes its pending edits), and a line that cannot be read is reported in
words and left as typed.
"""

from __future__ import annotations

import math

from engine import SAMPLER_CONTROLS, SamplerSettings, switched_on_by
from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QPlainTextEdit, QToolButton, QVBoxLayout, QWidget

from app.widgets.sampling.escaped_lines import format_lines, parse_lines
from app.widgets.sampling.param_row import ParamRow
from app.widgets.sampling.sampler_specs import BANNED_STRINGS_TEXT, OTHER_SECTION, SECTIONS, TEXT_SECTIONS, UNPLACED

# Fields whose spin box minimum stands for "off" (the registry's control says so) below which the settings keep an
# off value of their own: that value is stored, so presets still match.
_NEUTRAL = SamplerSettings()
OFF_VALUES: dict[str, float] = {
    f: getattr(_NEUTRAL, f) for f, c in SAMPLER_CONTROLS.items()
    if c.special and not c.lines and getattr(_NEUTRAL, f) < c.minimum
}
# Text boxes: label and tip (the stages' from the registry's controls).
TEXTS = {
    **{f: (SAMPLER_CONTROLS[f].label, SAMPLER_CONTROLS[f].tip) for f in ("dry_sequence_breakers", "logit_bias")},
    "banned_strings": BANNED_STRINGS_TEXT,
}


class Section(QWidget):
    """A header button that folds and unfolds its body."""

    def __init__(self, title: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = title
        self.header = QToolButton()
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setCheckable(True)
        self.header.setStyleSheet("QToolButton { border: none; font-weight: bold; }")
        self.header.setAccessibleName(title)
        self.body = QWidget()
        self.lay = QVBoxLayout(self.body)
        self.lay.setContentsMargins(0, 0, 0, 4)
        self.lay.setSpacing(4)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(2)
        col.addWidget(self.header)
        col.addWidget(self.body)
        self.header.toggled.connect(self.set_open)
        self.set_open(False)
        self.set_on(False)

    def set_open(self, on: bool) -> None:
        self.header.blockSignals(True)
        self.header.setChecked(on)
        self.header.blockSignals(False)
        self.header.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.body.setVisible(on)

    def set_on(self, on: bool) -> None:
        self.header.setText(f"{self.title}{' · on' if on else ''}")


class SamplerGroups(QWidget):
    """`edited(name, value)` for a SamplerSettings field; `invalid(message)` for a line that cannot be read."""

    edited = Signal(str, object)
    invalid = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.rows: dict[str, ParamRow] = {}
        self.texts: dict[str, QPlainTextEdit] = {}
        self.sections: dict[str, Section] = {}
        self._fields: dict[str, set[str]] = {}  # the settings fields each section holds
        self._shown: dict[str, str] = {}  # the text each box last agreed with the state on
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(2)
        other = ((OTHER_SECTION, UNPLACED),) if UNPLACED else ()
        for title, specs in (*SECTIONS, *other):
            section = self._section(title)
            for spec in specs:
                row = self.rows[spec.name] = ParamRow(spec)
                self._fields[title].add(spec.name)
                row.edited.connect(self._on_row_edited)
                section.lay.addWidget(row)
        for title, names in TEXT_SECTIONS:
            section = self._section(title)
            for name in names:
                section.lay.addWidget(self._text_box(name))
                self._fields[title].add(name)
        for section in self.sections.values():
            col.addWidget(section)

    def _section(self, title: str) -> Section:
        if title not in self.sections:
            self.sections[title] = Section(title)
            self._fields[title] = set()
        return self.sections[title]

    def _text_box(self, name: str) -> QPlainTextEdit:
        label, tip = TEXTS[name]
        box = self.texts[name] = QPlainTextEdit()
        box.setAccessibleName(label)
        box.setPlaceholderText(label + " — " + tip.split(":", 1)[-1].strip())
        box.setToolTip(tip)
        box.setTabChangesFocus(True)
        box.setFixedHeight(self.fontMetrics().lineSpacing() * 3 + 12)
        box.installEventFilter(self)
        return box

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.FocusOut and watched in self.texts.values():
            self.flush()
        return super().eventFilter(watched, event)

    def _on_row_edited(self, name: str, value: float | int) -> None:
        if name in OFF_VALUES and value <= self.rows[name].spec.minimum:
            value = OFF_VALUES[name]
        self.edited.emit(name, value)

    def flush(self) -> None:
        """Apply every text box that differs from what the state holds (focus left it, or the panel acts)."""
        for name, box in self.texts.items():
            text = box.toPlainText()
            if text == self._shown.get(name, ""):
                continue
            try:
                value = parse_logit_bias(text) if name == "logit_bias" else tuple(parse_lines(text))
            except ValueError as e:
                self.invalid.emit(str(e))  # left as typed until fixed: nothing is lost
                continue
            self._shown[name] = text
            self.edited.emit(name, value)

    def show_settings(self, s: SamplerSettings) -> None:
        """Text boxes and section headers follow the state (rows are set by the panel with its own)."""
        for name, box in self.texts.items():
            value = getattr(s, name)
            current = box.toPlainText()
            try:
                same = (parse_logit_bias(current) if name == "logit_bias" else tuple(parse_lines(current))) == value
            except ValueError:
                same = False
            if not same:
                text = format_logit_bias(value) if name == "logit_bias" else format_lines(value)
                box.blockSignals(True)
                box.setPlainText(text)
                box.blockSignals(False)
                current = text
            self._shown[name] = current
        for title, section in self.sections.items():  # on by the registry's rule (`active`) for what it holds
            fields = self._fields[title]
            section.set_on(switched_on_by(fields, s) or ("banned_strings" in fields and bool(s.banned_strings)))


def parse_logit_bias(text: str) -> tuple[tuple[int | str, float], ...]:
    """One `key = bias` per line: a token id, or a "quoted text"; bias a number, or ban / -inf / false.

    Raises:
        ValueError: the line that cannot be read, and how to write it.
    """
    out: list[tuple[int | str, float]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, raw = line.rpartition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f'logit bias line {n} ({line.strip()!r}): write id = bias or "text" = bias, e.g. 15043 = -5')
        raw = raw.strip().lower()
        try:
            bias = -math.inf if raw in ("ban", "-inf", "false") else float(raw)
        except ValueError:
            raise ValueError(f"logit bias line {n}: the bias must be a number or ban, got {raw!r}") from None
        if len(key) >= 2 and key[0] == key[-1] == '"':
            out.append((parse_lines(key[1:-1])[0] if key[1:-1] else "", bias))
        elif key.lstrip("+-").isdigit():
            out.append((int(key), bias))
        else:
            out.append((key, bias))
    return tuple(out)


def format_logit_bias(pairs: tuple[tuple[int | str, float], ...]) -> str:
    def key(k: int | str) -> str:
        return str(k) if isinstance(k, int) else '"' + format_lines([k]) + '"'

    return "\n".join(f"{key(k)} = {'ban' if b == -math.inf else f'{b:g}'}" for k, b in pairs)
