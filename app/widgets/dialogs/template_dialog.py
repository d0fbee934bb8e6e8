"""Model ▸ Chat template…: which template the loaded model's chats use, with a preview of what it renders.

The choices: the model's own (when it has one), the built-ins of
`engine.templates.choice` (ChatML, Llama 3, Gemma, Mistral, Phi-3, the plain
transcript), or a Jinja template pasted in. The preview renders a short chat
with the chosen text in the engine's sandbox (a second at most), so a broken or
refusing template says so before it is chosen. The dialog only chooses: the
caller applies the choice and remembers it for the model (app/actions/templates.py).
"""

from __future__ import annotations

import html

from engine import template_choice
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QPlainTextEdit, QVBoxLayout, QWidget,
)

OWN = "__own__"  # the combo's data for "the model's own template"
CUSTOM = "__custom__"  # ... for "a pasted Jinja template"


class TemplateDialog(QDialog):
    """Choose a chat template; `choice()` is None (the model's own), a built-in's name, or Jinja text."""

    def __init__(self, model_name: str, has_own: bool, current: str | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Chat template")
        self.setObjectName("template_dialog")
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.has_own = has_own
        self.intro = QLabel(
            f"How chats with <b>{html.escape(model_name)}</b> are turned into the text the model continues. "
            + ("It brings its own template." if has_own else
               "<b>It has no chat template</b>: a plain “User:/Assistant:” transcript is used unless you choose one. "
               "A base model is best used in a notebook (File ▸ New notebook).")
        )
        self.intro.setWordWrap(True)
        self.choice_box = QComboBox()
        self.choice_box.setAccessibleName("Template")
        if has_own:
            self.choice_box.addItem("The model's own", OWN)
        for t in template_choice.BUILTIN_TEMPLATES.values():
            self.choice_box.addItem(f"{t.label} (built-in)", t.name)
        self.choice_box.addItem("Paste a Jinja template…", CUSTOM)
        self.source_label = QLabel()
        self.source_label.setWordWrap(True)
        self.text_edit = QPlainTextEdit()
        self.text_edit.setAccessibleName("Template text")
        self.text_edit.setFont(mono)
        self.text_edit.setPlaceholderText("{% for message in messages %}…{% endfor %}")
        self.preview = QPlainTextEdit()
        self.preview.setReadOnly(True)
        self.preview.setAccessibleName("Preview")
        self.preview.setFont(mono)
        self.error_label = QLabel()
        self.error_label.setTextFormat(Qt.TextFormat.PlainText)  # Jinja errors quote the template's text
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        form = QFormLayout()
        form.addRow("Template", self.choice_box)
        form.addRow("", self.source_label)
        lay = QVBoxLayout(self)
        lay.addWidget(self.intro)
        lay.addLayout(form)
        lay.addWidget(QLabel("Jinja text"))
        lay.addWidget(self.text_edit, 2)
        lay.addWidget(QLabel("What a short chat becomes"))
        lay.addWidget(self.preview, 1)
        lay.addWidget(self.error_label)
        lay.addWidget(self.buttons)

        self.choice_box.currentIndexChanged.connect(self._on_choice)
        self.text_edit.textChanged.connect(self._update_preview)
        self._select(current)

    def _select(self, current: str | None) -> None:
        if current is None:
            data = OWN if self.has_own else "transcript"
        elif current in template_choice.BUILTIN_TEMPLATES:
            data = current
        else:
            data = CUSTOM
        self.choice_box.setCurrentIndex(self.choice_box.findData(data))
        self._on_choice()
        if data == CUSTOM:
            self.text_edit.setPlainText(current or "")

    def _on_choice(self) -> None:
        data = self.choice_box.currentData()
        builtin = template_choice.BUILTIN_TEMPLATES.get(data)
        self.text_edit.setReadOnly(data != CUSTOM)
        if builtin is not None:
            self.source_label.setText(f"From {builtin.source}")
            self.text_edit.setPlainText(builtin.text)
        elif data == OWN:
            self.source_label.setText("The template that came with the model file")
            self.text_edit.setPlainText("")
        else:
            self.source_label.setText("Rendered in the same sandbox, with the same limits, as a model's own")
            self.text_edit.clear()
            self.text_edit.setFocus()
        self._update_preview()

    def _update_preview(self) -> None:
        data = self.choice_box.currentData()
        text = self.text_edit.toPlainText()
        ok = True
        if data == OWN:
            self.preview.setPlainText("(the model's own template renders the chat)")
            self.error_label.setText("")
        elif not text.strip():
            self.preview.clear()
            self.error_label.setText("Paste a Jinja template (as in a model's tokenizer_config.json).")
            ok = False
        else:
            try:
                self.preview.setPlainText(template_choice.preview(text))
                self.error_label.setText("")
            except ValueError as e:  # ChatTemplateError: broken, refusing, or over a limit
                self.preview.clear()
                self.error_label.setText(str(e))
                ok = False
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(ok)

    def choice(self) -> str | None:
        data = self.choice_box.currentData()
        if data == OWN:
            return None
        if data == CUSTOM:
            return self.text_edit.toPlainText()
        return data
