"""Save preset: a name, whether the preset also keeps the answer length and the stop strings, and whether it
becomes the loaded model's own defaults (app/state/models/model_defaults.py)."""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLineEdit, QPushButton, QWidget


class SavePresetDialog(QDialog):
    """Asks for the preset's name; `choice()` is (name, include length and stop strings)."""

    def __init__(self, parent: QWidget | None = None, existing: list[str] | tuple[str, ...] = (), model: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Save preset")
        self._existing = set(existing)
        self.name_edit = QLineEdit()
        self.name_edit.setAccessibleName("Preset name")
        self.name_edit.setPlaceholderText("a name")
        self.include_length_and_stop = QCheckBox("Also keep the answer length and the stop strings")
        self.include_length_and_stop.setAccessibleName("Keep length and stop strings")
        self.include_length_and_stop.setToolTip(
            "Off: the preset holds the sampler settings only, and choosing it keeps the length and stop strings you have"
        )
        # Shown with a model loaded: this preset, its context length and the chat's system prompt, applied
        # whenever that model is opened again.
        self.for_model = QCheckBox(f"Save as this model's defaults ({model})")
        self.for_model.setAccessibleName("Save as this model's defaults")
        self.for_model.setToolTip(f"Opening {model} applies this preset, its context length and this chat's system "
                                  "prompt; the Sampling panel's Global defaults goes back")
        self.for_model.setVisible(bool(model))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.ok_button: QPushButton = buttons.button(QDialogButtonBox.StandardButton.Save)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Name", self.name_edit)
        form.addRow(self.include_length_and_stop)
        form.addRow(self.for_model)
        form.addRow(buttons)
        self.name_edit.textChanged.connect(self._on_name_changed)
        self._on_name_changed("")

    def _on_name_changed(self, text: str) -> None:
        name = text.strip()
        self.ok_button.setEnabled(bool(name))
        self.ok_button.setText("Replace" if name in self._existing else "Save")

    def choice(self) -> tuple[str, bool]:
        return self.name_edit.text().strip(), self.include_length_and_stop.isChecked()

    @staticmethod
    def ask(parent: QWidget | None, existing: list[str], model: str = "") -> tuple[str, bool, bool] | None:
        """Show the dialog: the user's (name, include length and stop, make it `model`'s defaults), or None when
        cancelled; without a model loaded ("") the last is always False."""
        dialog = SavePresetDialog(parent, existing, model)
        try:
            if dialog.exec() != QDialog.DialogCode.Accepted:
                return None
            return (*dialog.choice(), dialog.for_model.isChecked() and bool(model))
        finally:
            dialog.deleteLater()
