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

from engine import SamplerSettings
from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QPlainTextEdit, QToolButton, QVBoxLayout, QWidget

from app.widgets.escaped_lines import format_lines, parse_lines
from app.widgets.param_row import ParamRow, ParamSpec

P = ParamSpec
SECTIONS: tuple[tuple[str, tuple[ParamSpec, ...]], ...] = (
    ("Dynamic temp · top-nσ", (
        P("dynatemp_range", "Dyn. range", "Dynamic temperature: the temperature varies by up to ± this with the "
          "distribution's entropy (confident → cooler); off = 0", 0.0, 5.0, 0.05, 2, 2.0, "off"),
        P("dynatemp_exponent", "Dyn. exponent", "Dynamic temperature: how entropy maps to temperature; 1 = linear",
          0.05, 10.0, 0.05, 2, 4.0),
        P("top_n_sigma", "Top-nσ", "Keep tokens whose logit is within n standard deviations of the top logit; off ≤ 0",
          0.0, 10.0, 0.05, 2, 5.0, "off"),
    )),
    ("DRY (repetition of phrases)", (
        P("dry_multiplier", "DRY strength", "DRY: penalises a token that would extend a phrase already in the text; "
          "off = 0", 0.0, 5.0, 0.05, 2, 2.0, "off"),
        P("dry_base", "DRY base", "DRY: the penalty grows as base ^ (repeat length − allowed length)", 1.0, 4.0, 0.05, 2),
        P("dry_allowed_length", "DRY allowed", "DRY: repeats up to this many tokens are free", 0, 100, 1, 0, 20),
        P("dry_penalty_last_n", "DRY look back", "DRY: how many recent tokens are searched for repeats; all = the "
          "whole text, 0 = off", -1, 32768, 1, 0, 4096, "all"),
    )),
    ("Mirostat", (
        P("mirostat", "Mirostat", "Mirostat: steers each pick toward a target surprise (1 or 2 = its version); off = 0",
          0, 2, 1, 0, None, "off"),
        P("mirostat_tau", "Mirostat τ", "Mirostat: the target surprise in bits (higher = more varied text)",
          0.1, 20.0, 0.1, 1, 10.0),
        P("mirostat_eta", "Mirostat η", "Mirostat: how fast it corrects toward the target (learning rate)",
          0.01, 1.0, 0.01, 2),
    )),
    ("Adaptive-p", (
        P("adaptive_target", "Adaptive target", "Adaptive-p: favours tokens near this probability, adapting to the "
          "recent picks; off below 0", -0.01, 1.0, 0.01, 2, None, "off"),
        P("adaptive_decay", "Adaptive decay", "Adaptive-p: how long it remembers recent picks (≈ 1 / (1 − decay) "
          "tokens)", 0.0, 0.99, 0.01, 2),
    )),
    ("Smoothing (quadratic)", (
        P("smoothing_factor", "Smoothing", "Quadratic sampling: flattens the top and cuts the tail around the most "
          "likely token (text-generation-webui); off = 0", 0.0, 10.0, 0.01, 2, 3.0, "off"),
        P("smoothing_curve", "Smoothing curve", "Quadratic sampling: 1 = plain quadratic, more = a steeper tail",
          1.0, 10.0, 0.05, 2, 5.0),
    )),
)
# Fields whose spin box minimum stands for "off": the settings' own off value is stored, so presets still match.
OFF_VALUES = {"top_n_sigma": -1.0, "adaptive_target": -1.0}
TEXTS = {
    "dry_sequence_breakers": ("DRY breakers", "DRY: a repeat never runs across these texts, one per line (\\n = a "
                              "newline); empty = none"),
    "logit_bias": ("Logit bias", 'Added to a token\'s logit, one per line: 15043 = -5 for a token id, "hello" = 2 for '
                   "every token of a text, ban (or -inf) to forbid it"),
    "banned_strings": ("Banned strings", "Phrases the answer must not contain, one per line: when one appears, the "
                       "answer steps back to where it began and takes another token there"),
}
TEXT_SECTIONS = (("DRY (repetition of phrases)", ("dry_sequence_breakers",)),
                 ("Logit bias · banned strings", ("logit_bias", "banned_strings")))


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
        self.lay.setContentsMargins(12, 0, 0, 4)
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
        self._shown: dict[str, str] = {}  # the text each box last agreed with the state on
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(2)
        for title, specs in SECTIONS:
            section = self._section(title)
            for spec in specs:
                row = self.rows[spec.name] = ParamRow(spec)
                row.edited.connect(self._on_row_edited)
                section.lay.addWidget(row)
        for title, names in TEXT_SECTIONS:
            section = self._section(title)
            for name in names:
                section.lay.addWidget(self._text_box(name))
        for section in self.sections.values():
            col.addWidget(section)

    def _section(self, title: str) -> Section:
        if title not in self.sections:
            self.sections[title] = Section(title)
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
        on = {
            "Dynamic temp · top-nσ": s.dynatemp_range > 0 or s.top_n_sigma > 0,
            "DRY (repetition of phrases)": s.dry_multiplier > 0,
            "Mirostat": s.mirostat != 0,
            "Adaptive-p": s.adaptive_target >= 0,
            "Smoothing (quadratic)": s.smoothing_factor > 0,
            "Logit bias · banned strings": bool(s.logit_bias or s.banned_strings),
        }
        for title, section in self.sections.items():
            section.set_on(on.get(title, False))


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
