"""Chat templates in the window: the choice remembered per model and applied when it loads, the dialog that
changes it, the status bar's word on it, and base models opening in a notebook.

A model without a chat template chats through a plain "User:/Assistant:"
transcript, which a base model continues poorly; the status bar says so, and
an empty conversation becomes a notebook when such a model loads (app/state/notebook.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from engine import ModelInfo, template_choice

from app.controllers.engine_host import EngineHost
from app.state.notebook import NOTEBOOK, is_notebook
from app.state.conversation_list import Library
from app.state.database.store import Store

if TYPE_CHECKING:  # imported when the dialog first opens
    from app.widgets.dialogs.template_dialog import TemplateDialog

log = logging.getLogger(__name__)

TEMPLATES_KEY = "chat_templates"  # settings: {model key: a built-in's name or Jinja text}


def model_key(info: ModelInfo) -> str:
    """What a template choice is remembered under: the model's spec (its file, folder, hub id or URL)."""
    return info.spec or info.path or info.name


def remembered(store: Store, info: ModelInfo) -> str | None:
    choices = store.get_setting(TEMPLATES_KEY, {})
    choice = choices.get(model_key(info)) if isinstance(choices, dict) else None
    return choice if isinstance(choice, str) and choice.strip() else None


def remember(store: Store, info: ModelInfo, choice: str | None) -> None:
    choices = store.get_setting(TEMPLATES_KEY, {})
    choices = dict(choices) if isinstance(choices, dict) else {}
    if choice is None:
        choices.pop(model_key(info), None)
    else:
        choices[model_key(info)] = choice
    store.put_setting(TEMPLATES_KEY, choices)


def status_text(used: "template_choice.TemplateInUse | None", notebook: bool) -> tuple[str, str, bool]:
    """(label, tooltip, warn) for the status bar."""
    if notebook:
        return "Notebook · no template", "The notebook's text is continued as it is: no chat template applies.", False
    if used is None:
        return "", "", False
    if used.kind == "fallback":
        return "⚠ No chat template", used.warning, True
    short = {"own": "the model's own", "custom": "custom"}.get(used.kind, used.label)
    return f"Template: {short}", f"Chats with this model are rendered with {used.label} (Model ▸ Chat template…).", False


class TemplateActions:
    """Owned by the window: follows model loads and the open conversation; opens the dialog."""

    def __init__(self, store: Store, host: EngineHost, library: Library, status: Any, parent: Any):
        self._store, self._host, self._library, self._status, self._parent = store, host, library, status, parent
        self.used: template_choice.TemplateInUse | None = None
        self.dialog: TemplateDialog | None = None  # the latest one opened
        host.model_changed.connect(self._on_model_changed)
        library.current_changed.connect(self._on_conversation_changed)
        if host.engine is not None and host.info is not None:
            self._on_model_changed(host.info)
        else:
            self.refresh()

    def detach(self) -> None:
        self._host.model_changed.disconnect(self._on_model_changed)
        self._library.current_changed.disconnect(self._on_conversation_changed)

    def _tokenizer(self) -> Any | None:
        engine = self._host.engine
        if engine is None or not engine.is_loaded:
            return None
        return engine.tokenizer

    def _on_model_changed(self, info: ModelInfo) -> None:
        tokenizer = self._tokenizer()
        if tokenizer is None:
            return
        choice = remembered(self._store, info)
        try:
            self.used = template_choice.use_chat_template(tokenizer, choice)
        except ValueError as e:  # a remembered template that no longer renders: the model's own, and say why
            log.warning("the remembered chat template of %s is not used: %s", info.name, e)
            self.used = template_choice.use_chat_template(tokenizer, None)
            self._status.showMessage(f"The chat template chosen for {info.name} is not used: {e}", 15000)
        current = self._library.current
        if self.used.kind == "fallback" and current is not None and not current.messages:
            self._library.new(mode=NOTEBOOK)  # a base model: the empty conversation becomes a notebook
        self.refresh()

    def _on_conversation_changed(self, _conv: Any) -> None:
        self.refresh()

    def refresh(self) -> None:
        self._status.show_template(*status_text(self.used, is_notebook(self._library.current)))

    def open_dialog(self) -> None:
        """Model ▸ Chat template…: choose, then apply to the loaded model and remember for it."""
        from app.widgets.dialogs.template_dialog import TemplateDialog

        tokenizer, info = self._tokenizer(), self._host.info
        if tokenizer is None or info is None:
            self._status.showMessage("Load a model first: the template is chosen for the loaded model.", 6000)
            return
        has_own = tokenizer.has_chat_template and not tokenizer.guessed_template
        dialog = TemplateDialog(info.name, has_own, remembered(self._store, info), self._parent)
        dialog.accepted.connect(lambda: self.choose(dialog.choice()))
        dialog.open()
        self.dialog = dialog

    def choose(self, choice: str | None) -> template_choice.TemplateInUse | None:
        """Use `choice` for the loaded model from now on and remember it (None: the model's own)."""
        tokenizer, info = self._tokenizer(), self._host.info
        if tokenizer is None or info is None:
            return None
        try:
            self.used = template_choice.use_chat_template(tokenizer, choice)
        except ValueError as e:
            self._status.showMessage(f"That chat template cannot be used: {e}", 15000)
            return None
        remember(self._store, info, choice)
        self.refresh()
        self._status.showMessage(f"Chats with {info.name} now use {self.used.label}.", 6000)
        return self.used
