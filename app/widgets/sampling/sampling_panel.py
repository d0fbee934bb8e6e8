"""Every sampler parameter, the stage order, length and stop strings, presets and reset.

Edits go to `SettingsState`, which validates them; a refused value is put
back and the reason shown under the controls. The panel follows the state
(a preset applied, a reset) through `_on_settings_changed`.

The stop strings box waits for a pause in typing before it applies; an edit
still waiting is applied before anything else the panel does, when the box
loses focus and when the panel is hidden (the window closing), so no click
that follows can lose it.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QRegularExpression, Qt, QTimer, Signal
from PySide6.QtGui import QHideEvent, QRegularExpressionValidator
from PySide6.QtWidgets import (
    QMainWindow,
    QAbstractSlider,
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from engine import GenerationStats, ModelInfo

from app.controllers.chat import ChatController
from app.state.conversation import Conversation, Message
from app.state.settings import MAX_NEW_TOKENS_LIMIT, PRESET_DESCRIPTIONS, GenerationOptions, SettingsState
from app.widgets.sampling.escaped_lines import format_lines as format_stop
from app.widgets.sampling.escaped_lines import parse_lines as parse_stop
from app.widgets.dialogs.llamacpp_dialog import LlamaCppJsonDialog
from app.widgets.sampling.param_row import ParamRow, ParamSpec
from app.widgets.sampling.sampler_groups import TEXTS, SamplerGroups
from app.widgets.sampling.sampler_specs import FILTERS, PENALTIES, XTC
from app.widgets.sampling.sampling_mode import SamplingModeBox, show_limit
from app.state.models import model_defaults
from app.widgets.sampling.save_preset_dialog import SavePresetDialog
from app.widgets.sampling.stage_order import StageOrderList
from app.widgets.sampling.structured_output import StructuredOutputBox
from app.widgets.subscriptions import follow

MAX_TOKENS = ParamSpec("max_new_tokens", "Max new tokens", "The answer stops after this many tokens", 1, MAX_NEW_TOKENS_LIMIT, 1, 0, 4096)
CUSTOM = "Custom"


class SamplingPanel(QScrollArea):
    min_width_changed = Signal(int)  # the controls' minimum changed (a style, a font, a section opened)

    def __init__(self, settings: SettingsState, controller: ChatController, parent: QWidget | None = None):
        super().__init__(parent)
        self._settings = settings
        self._controller = controller
        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # rows shrink to the dock
        self.setAccessibleName("Sampling settings")
        body = QWidget()
        col = QVBoxLayout(body)
        col.setContentsMargins(8, 8, 8, 8)
        self._build_presets(col)
        self._build_samplers(col)
        col.addWidget(self._seed_box())
        col.addWidget(self._length_box())
        col.addWidget(self._order_box())
        col.addWidget(StructuredOutputBox(settings))  # JSON schema / regex / grammar (docs/constraints.md)
        col.addWidget(self._error_label())
        col.addStretch(1)
        self.setWidget(body)
        self._align_rows()
        self._guard_wheel(body)
        # The dock may not be narrowed below what the controls need: they are never cut off on the
        # right (there is no horizontal scroll bar); only the height scrolls.
        self._fit_width()
        body.installEventFilter(self)  # its minimum is known for sure only once it is shown and polished

        self._stop_timer = QTimer(self)
        self._stop_timer.setSingleShot(True)
        self._stop_timer.setInterval(400)
        self._stop_timer.timeout.connect(self._apply_stop)
        self._connect_controls()
        follow(self, (
            (settings.changed, self._on_settings_changed),
            (settings.presets_changed, self._on_presets_changed),
            (controller.finished, self._on_generation_finished),
            (controller.library.current_changed, self._on_conversation_changed),
            (controller.host.model_changed, self._on_model_changed),  # the host outlives this window
        ))
        self._on_presets_changed()
        self._on_settings_changed(settings.options)

    def _build_presets(self, col: QVBoxLayout) -> None:
        """The preset box, its Save, Delete and Reset buttons, the llama.cpp JSON button and the sampling mode."""
        presets = QHBoxLayout()
        self.preset_box = QComboBox()
        self.preset_box.setAccessibleName("Preset")
        self.preset_box.setToolTip("Load a preset")
        self.save_preset_button = QPushButton("Save…")
        self.save_preset_button.setAccessibleName("Save preset")
        self.delete_preset_button = QPushButton("Delete")
        self.delete_preset_button.setAccessibleName("Delete preset")
        self.reset_button = QPushButton("Reset")
        self.reset_button.setAccessibleName("Reset to defaults")
        self.reset_button.setToolTip("Back to the defaults (the Balanced preset, 512 tokens, no stop strings)")
        self.json_button = QPushButton("llama.cpp JSON…")
        self.json_button.setAccessibleName("llama.cpp JSON")
        self.json_button.setToolTip("Import a llama.cpp or SillyTavern setup as JSON, or copy these settings out")
        presets.addWidget(self.preset_box, 1)
        col.addLayout(presets)
        preset_buttons = QHBoxLayout()
        for b in (self.save_preset_button, self.delete_preset_button, self.reset_button):
            preset_buttons.addWidget(b)
        col.addLayout(preset_buttons)
        self.global_defaults_button = QPushButton("Global defaults")  # app/state/models/model_defaults.py
        self.global_defaults_button.setAccessibleName("Use the global defaults")
        self.global_defaults_button.setToolTip("Forget the loaded model's own defaults and use the global ones again")
        self.global_defaults_button.clicked.connect(self.use_global_defaults)
        col.addWidget(self.global_defaults_button)
        col.addWidget(self.json_button)
        self.mode_box = SamplingModeBox(self._settings, self._controller.host)  # remote models only: who samples
        col.addWidget(self.mode_box)

    def _build_samplers(self, col: QVBoxLayout) -> None:
        """The parameter rows: filters, penalties and XTC in groups of their own, then the other samplers."""
        self.rows: dict[str, ParamRow] = {}
        for title, specs in (("Temperature and filters", FILTERS), ("Penalties", PENALTIES), ("XTC", XTC)):
            col.addWidget(self._group(title, specs))
        more_box = QGroupBox("More samplers")
        more = QVBoxLayout(more_box)
        self.groups = SamplerGroups()  # DRY, top-nσ, dynamic temperature, mirostat, adaptive-p, smoothing, bias, bans
        self.rows.update(self.groups.rows)
        more.addWidget(self.groups)
        col.addWidget(more_box)

    def _seed_box(self) -> QGroupBox:
        """The seed: a number, Random, and Use last."""
        seed_box = QGroupBox("Seed")
        seed_col = QVBoxLayout(seed_box)  # two rows: one row was the widest thing in the panel at 1024 px
        seed_row, seed_buttons = QHBoxLayout(), QHBoxLayout()
        seed_col.addLayout(seed_row)
        seed_col.addLayout(seed_buttons)
        self.seed_edit = QLineEdit()
        self.seed_edit.setAccessibleName("Seed")
        self.seed_edit.setPlaceholderText("a number")
        # Room for the placeholder and an eight-digit seed, so neither is cut off in a narrow dock.
        self.seed_edit.setMinimumWidth(self.seed_edit.fontMetrics().horizontalAdvance("a number  ") + 16)
        # Digits only, below 2**63 (18 digits always fit): nothing invalid can be typed.
        self.seed_edit.setValidator(QRegularExpressionValidator(QRegularExpression(r"^\d{1,18}$")))
        self.random_seed = QCheckBox("Random")
        self.random_seed.setAccessibleName("Random seed")
        self.random_seed.setToolTip("A fresh seed for every answer (the one used is shown in the inspector)")
        self.last_seed_button = QPushButton("Use last")
        self.last_seed_button.setAccessibleName("Use the last answer's seed")
        self.last_seed_button.setToolTip("Fix the seed of the last answer, to reproduce or vary it")
        seed_row.addWidget(self.seed_edit, 1)
        seed_buttons.addWidget(self.random_seed)
        seed_buttons.addStretch(1)
        seed_buttons.addWidget(self.last_seed_button)
        return seed_box

    def _length_box(self) -> QGroupBox:
        """Max new tokens and the stop strings box."""
        length_box = QGroupBox("Length and stop strings")
        length = QVBoxLayout(length_box)
        self.max_tokens = ParamRow(MAX_TOKENS)
        length.addWidget(self.max_tokens)
        self.stop_edit = QPlainTextEdit()
        self.stop_edit.setAccessibleName("Stop strings")
        self.stop_edit.setPlaceholderText("Stop strings, one per line (\\n for a newline)")
        self.stop_edit.setFixedHeight(self.fontMetrics().lineSpacing() * 3 + 12)
        self.stop_edit.setTabChangesFocus(True)  # a tab is typed as \t; Tab moves on, as in every other field
        self.stop_edit.installEventFilter(self)  # focus out applies a pending edit
        self._shown_stop: tuple[str, ...] = ()  # the state's stop strings the box last agreed with
        length.addWidget(self.stop_edit)
        return length_box

    def _order_box(self) -> QGroupBox:
        """The stage order list."""
        order_box = QGroupBox("Stage order")
        order = QVBoxLayout(order_box)
        self.stage_order = StageOrderList()
        order.addWidget(self.stage_order)
        return order_box

    def _error_label(self) -> QLabel:
        """Where a refused value's reason shows, under the controls (hidden while there is none)."""
        self.error_label = QLabel()
        self.error_label.setTextFormat(Qt.TextFormat.PlainText)  # errors quote what was typed
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d9534f")
        self.error_label.setAccessibleName("Settings error")
        self.error_label.setVisible(False)
        return self.error_label

    def _connect_controls(self) -> None:
        """Each control's edit to the handler that hands it to the settings."""
        for name, row in self.rows.items():
            if name not in self.groups.rows:  # the groups' rows reach us through `groups.edited`
                row.edited.connect(self._on_param_edited)
        self.max_tokens.edited.connect(self._on_max_tokens_edited)
        self.seed_edit.editingFinished.connect(self._on_seed_edited)
        self.random_seed.toggled.connect(self._on_random_toggled)
        self.last_seed_button.clicked.connect(self._on_use_last_seed)
        self.stop_edit.textChanged.connect(self._stop_timer.start)
        self.stage_order.order_changed.connect(self._on_order_changed)
        self.preset_box.activated.connect(self._on_preset_chosen)
        self.save_preset_button.clicked.connect(self._on_save_preset_clicked)
        self.delete_preset_button.clicked.connect(self._on_delete_preset_clicked)
        self.reset_button.clicked.connect(self._on_reset_clicked)
        self.json_button.clicked.connect(self._on_json_clicked)
        self.groups.edited.connect(self._on_param_edited)
        self.groups.invalid.connect(self._show_error)

    def _align_rows(self) -> None:
        """One label width and one value-box width for every row: the sliders line up."""
        rows = [*self.rows.values(), self.max_tokens]
        label_w = max(r.label.minimumSizeHint().width() for r in rows)
        spin_w = max(r.spin.minimumWidth() for r in rows)
        for r in rows:
            r.label.setMinimumWidth(label_w)
            r.spin.setMinimumWidth(spin_w)

    def _guard_wheel(self, body: QWidget) -> None:
        """A wheel turned over a slider, value box or combo scrolls the panel unless that control has focus.

        Otherwise scrolling down the panel changes every value the pointer passes over.
        """
        for w in body.findChildren(QWidget):
            if isinstance(w, (QAbstractSlider, QAbstractSpinBox, QComboBox)):
                w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # no focus by wheel
                w.installEventFilter(self)

    def _fit_width(self) -> None:
        body = self.widget()
        if body is None:  # no controls to fit yet
            return
        width = body.minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width()
        if width != self.minimumWidth():
            self.setMinimumWidth(width)
            self.min_width_changed.emit(width)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self._fit_width()
        elif watched is self.stop_edit and event.type() == QEvent.Type.FocusOut:
            self.flush_pending_edits()
        elif event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            self.verticalScrollBar().event(event)  # hand the wheel to the panel's scroll bar
            return True
        return super().eventFilter(watched, event)

    def _group(self, title: str, specs: tuple[ParamSpec, ...]) -> QGroupBox:
        box = QGroupBox(title)
        lay = QVBoxLayout(box)
        lay.setSpacing(4)
        for spec in specs:
            row = self.rows[spec.name] = ParamRow(spec)
            lay.addWidget(row)
        return box

    # -- edits -> state --------------------------------------------------------------------

    def flush_pending_edits(self) -> None:
        """Apply the stop strings now if the box is still waiting for a pause in typing."""
        if self._stop_timer.isActive():
            self._stop_timer.stop()
            self._apply_stop()
        self.groups.flush()  # logit bias, banned strings, DRY breakers typed and not yet applied

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802 - Qt's name
        self.flush_pending_edits()  # the window is closing (or the dock hiding): keep what was typed
        super().hideEvent(event)

    def _apply(self, fn: Callable[..., object], *args: object, **kwargs: object) -> bool:
        self.flush_pending_edits()  # first the stop strings typed a moment ago, then this edit
        try:
            fn(*args, **kwargs)
        except ValueError as e:
            self._show_error(str(e))
            self._on_settings_changed(self._settings.options)  # put the refused value back
            return False
        self._show_error("")
        return True

    def _on_param_edited(self, name: str, value: float | int) -> None:
        self._apply(self._settings.update_sampler, **{name: value})

    def _on_max_tokens_edited(self, _name: str, value: int) -> None:
        self._apply(self._settings.set_max_new_tokens, int(value))

    def _on_seed_edited(self) -> None:
        text = self.seed_edit.text().strip()
        if text and not self.random_seed.isChecked():
            self._apply(self._settings.update_sampler, seed=int(text))

    def _on_random_toggled(self, random: bool) -> None:
        self.seed_edit.setEnabled(not random)
        if random:
            self._apply(self._settings.update_sampler, seed=None)
        else:
            text = self.seed_edit.text().strip()
            seed = int(text) if text else (self._controller.last_answer_seed() or 0)
            self._apply(self._settings.update_sampler, seed=seed)

    def _on_use_last_seed(self) -> None:
        seed = self._controller.last_answer_seed()
        if seed is not None:
            self._apply(self._settings.update_sampler, seed=seed)

    def _apply_stop(self) -> None:
        stop = tuple(parse_stop(self.stop_edit.toPlainText()))
        previous, self._shown_stop = self._shown_stop, stop  # the change it makes must not rewrite the box
        try:
            self._settings.set_stop(stop)
        except ValueError as e:
            # The text stays as typed (nothing is lost); the reason is shown until it is fixed.
            self._shown_stop = previous
            self._show_error(str(e))
            return
        self._show_error("")

    def _on_reset_clicked(self) -> None:
        self.flush_pending_edits()  # applied, then reset with the rest: Reset means reset
        self._settings.reset()

    def _on_order_changed(self, order: tuple[str, ...]) -> None:
        self._apply(self._settings.update_sampler, order=order)

    def _on_preset_chosen(self, index: int) -> None:
        name = self.preset_box.itemText(index)
        if name != CUSTOM:
            self._apply(self._settings.apply_preset, name)
            self._select_matching_preset()  # the same values under another name: the chosen name shows

    def _on_save_preset_clicked(self) -> None:
        self.flush_pending_edits()  # the stop strings a preset may keep are the ones typed so far
        info = self._controller.host.info
        answer = SavePresetDialog.ask(self, self._settings.preset_names(), info.name if info else "")
        if answer is not None and answer[0]:
            self.save_preset(*answer)

    def _on_json_clicked(self) -> None:
        self.flush_pending_edits()
        dialog = LlamaCppJsonDialog(self._settings, self)
        try:
            dialog.exec()
        finally:
            dialog.deleteLater()

    def save_preset(self, name: str, include_length_and_stop: bool = False, for_model: bool = False) -> bool:
        saved = self._apply(self._settings.save_preset, name, include_length_and_stop)
        if saved and for_model:
            model_defaults.save_for_loaded(self._controller.library, self._controller.host, name)
        return saved

    def use_global_defaults(self) -> None:
        """Forget the loaded model's defaults and put back the global options (said in the status bar)."""
        text = model_defaults.back_to_global(self._controller.library.store, self._settings, self._controller.host)
        window = self.window()
        if isinstance(window, QMainWindow):
            window.statusBar().showMessage(text, 8000)

    def _on_delete_preset_clicked(self) -> None:
        name = self.preset_box.currentText()
        if self._settings.is_builtin(name) or name == CUSTOM:
            return
        answer = QMessageBox.question(self, "Delete preset", f"Delete the preset “{name}”?")
        if answer == QMessageBox.StandardButton.Yes:
            self._apply(self._settings.delete_preset, name)

    def _show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    # -- state -> widgets ------------------------------------------------------------------

    def _on_settings_changed(self, options: GenerationOptions) -> None:
        s = options.sampler
        for name, row in self.rows.items():
            row.set_value(getattr(s, name))
        self.groups.show_settings(s)
        self.max_tokens.set_value(options.max_new_tokens)
        self.random_seed.blockSignals(True)
        self.random_seed.setChecked(s.seed is None)
        self.random_seed.blockSignals(False)
        self.seed_edit.setEnabled(s.seed is not None)
        if s.seed is not None:
            self.seed_edit.setText(str(s.seed))
        if options.stop != self._shown_stop:
            # The stop strings changed elsewhere (reset, a preset that holds some): they replace the box.
            # Any other change leaves the box, and an edit still waiting in it, alone.
            self._stop_timer.stop()
            self._shown_stop = options.stop
            if parse_stop(self.stop_edit.toPlainText()) != list(options.stop):
                self.stop_edit.blockSignals(True)
                self.stop_edit.setPlainText(format_stop(options.stop))
                self.stop_edit.blockSignals(False)
        if self.stage_order.order() != s.order:
            self.stage_order.set_order(s.order)
        self._select_matching_preset()
        self.mode_box.update_from(self._controller.host.info)
        self._apply_server_limits()

    def _on_presets_changed(self) -> None:
        self.preset_box.blockSignals(True)
        self.preset_box.clear()
        self.preset_box.addItems(self._settings.preset_names())
        for i, name in enumerate(self._settings.preset_names()):  # what a built-in does, on hover
            if name in PRESET_DESCRIPTIONS:
                self.preset_box.setItemData(i, PRESET_DESCRIPTIONS[name], Qt.ItemDataRole.ToolTipRole)
        self.preset_box.blockSignals(False)
        self._select_matching_preset()

    def _select_matching_preset(self) -> None:
        name = self._settings.matching_preset()
        i_custom = self.preset_box.findText(CUSTOM)
        if name is None:
            if i_custom < 0:
                self.preset_box.addItem(CUSTOM)
            self.preset_box.setCurrentText(CUSTOM)
        else:
            if i_custom >= 0:
                self.preset_box.removeItem(i_custom)
            self.preset_box.setCurrentText(name)
        self.preset_box.setToolTip(f"{PRESET_DESCRIPTIONS[name]} (Load a preset)" if name in PRESET_DESCRIPTIONS
                                   else "Load a preset")
        self.delete_preset_button.setEnabled(name is not None and not self._settings.is_builtin(name))

    def _on_generation_finished(self, _message: Message, _stats: GenerationStats | None) -> None:
        self._apply_server_limits()  # "Use last" now has a seed to use

    def _on_conversation_changed(self, _conversation: Conversation | None) -> None:
        self._apply_server_limits()  # "Use last" follows the open conversation's latest answer

    def _on_model_changed(self, info: ModelInfo) -> None:
        self.mode_box.update_from(info)
        self._apply_server_limits()

    def _apply_server_limits(self) -> None:
        """In server-samples mode, the controls the server has no parameter for are off, saying why."""
        limits = self.mode_box.limits(self._controller.host.info)
        for name, row in self.rows.items():
            show_limit([row.label, row.spin, row.slider], limits.get(name), row.spec.tip)
        for name, box in self.groups.texts.items():
            show_limit([box], limits.get(name), TEXTS[name][1])
        show_limit([self.seed_edit], limits.get("seed"), "")
        if "seed" not in limits:
            self.seed_edit.setEnabled(self._settings.options.sampler.seed is not None)
        show_limit([self.last_seed_button], limits.get("seed"), "Fix the seed of the last answer, to reproduce or vary it")
        if "seed" not in limits:
            self.last_seed_button.setEnabled(self._controller.last_answer_seed() is not None)
        show_limit([self.stage_order], limits.get("order"), "")
