"""llama.cpp server JSON: paste a setup from llama.cpp or SillyTavern to import it, or copy ours out.

The JSON box holds the current settings when the dialog opens (what Copy
copies). Import reads whatever is in the box through the engine
(`engine.parse_llamacpp_json`): bad JSON or refused values are one message
under the box and nothing changes (the text stays as typed); a setup that
reads is applied, and saved as a preset when a name is given. Fields that were
not read, and what llama.cpp would do differently from ours, are listed.
"""

from __future__ import annotations

from dataclasses import replace

from engine import ImportedSettings, llamacpp_json, parse_llamacpp_json
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.state.settings import GenerationOptions, SettingsState


class LlamaCppJsonDialog(QDialog):
    def __init__(self, settings: SettingsState, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("llama.cpp JSON")
        self._settings = settings
        self.resize(520, 480)
        intro = QLabel("The sampler settings as llama.cpp server JSON. Paste a llama.cpp request or a SillyTavern "
                       "preset here and Import it, or Copy these settings out.")
        intro.setWordWrap(True)
        self.text = QPlainTextEdit()
        self.text.setAccessibleName("llama.cpp JSON")
        self.notes = QLabel()
        self.notes.setTextFormat(Qt.TextFormat.PlainText)  # quotes the pasted JSON's keys
        self.notes.setWordWrap(True)
        self.notes.setAccessibleName("llama.cpp JSON notes")
        self.name_edit = QLineEdit()
        self.name_edit.setAccessibleName("Preset name for the import")
        self.name_edit.setPlaceholderText("save the import as a preset named… (optional)")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the JSON in the box to the clipboard")
        self.import_button = QPushButton("Import")
        self.import_button.setToolTip("Apply the settings in the box (and save them as a preset, if named)")
        self.current_button = QPushButton("Current settings")
        self.current_button.setToolTip("Put the current settings back in the box")
        row = QHBoxLayout()
        row.addWidget(self.name_edit, 1)
        row.addWidget(self.import_button)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(self.current_button, QDialogButtonBox.ButtonRole.ResetRole)
        buttons.rejected.connect(self.reject)
        col = QVBoxLayout(self)
        col.addWidget(intro)
        col.addWidget(self.text, 1)
        col.addWidget(self.notes)
        col.addLayout(row)
        col.addWidget(buttons)
        self.copy_button.clicked.connect(self._on_copy)
        self.import_button.clicked.connect(self.import_text)
        self.current_button.clicked.connect(self.show_current)
        self.show_current()

    def show_current(self) -> None:
        o = self._settings.options
        text, differences = llamacpp_json(o.sampler, o.max_new_tokens, o.stop)
        self.text.setPlainText(text)
        self._say(("llama.cpp would not do all of this as here: " + "; ".join(differences) + ".")
                  if differences else "")

    def _on_copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text.toPlainText())

    def import_text(self) -> bool:
        """Apply the JSON in the box; False (and the reason shown, nothing changed) when it cannot be read."""
        try:
            got = parse_llamacpp_json(self.text.toPlainText())
            options = _options_with(self._settings.options, got)
            name = self.name_edit.text().strip()
            if name:
                self._check_name(name)
        except ValueError as e:
            self._say(f"Not imported: {e}. Nothing was changed.", error=True)
            return False
        self._settings.set_options(options)
        if name:
            self._settings.save_preset(name, include_length_and_stop=got.max_new_tokens is not None or got.stop is not None)
        said = [f"Imported{f' as the preset “{name}”' if name else ''}."]
        said += [n[0].upper() + n[1:] + "." for n in got.notes]
        if got.ignored:
            said.append("Not used here: " + ", ".join(got.ignored) + ".")
        self._say(" ".join(said))
        return True

    def _check_name(self, name: str) -> None:
        if self._settings.is_builtin(name):
            raise ValueError(f"{name!r} is a built-in preset; choose another name")

    def _say(self, text: str, error: bool = False) -> None:
        self.notes.setText(text)
        self.notes.setStyleSheet("color: #d9534f" if error else "")


def _options_with(options: GenerationOptions, got: ImportedSettings) -> GenerationOptions:
    """`options` with the imported sampler, length and stop strings (validated: ValueError in words)."""
    return replace(options, sampler=got.sampler,
                   max_new_tokens=options.max_new_tokens if got.max_new_tokens is None else got.max_new_tokens,
                   stop=options.stop if got.stop is None else got.stop)
