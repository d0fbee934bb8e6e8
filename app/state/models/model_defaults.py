"""A model's own defaults: the sampler preset, context length and system prompt the user saved for it.

Kept in the store's settings under the model's spec and the backend it was opened with, as its runtime
settings are (app/state/models/runtime_choices.py): what identifies a model file here. Its chat template choice is
already remembered per model (app/actions/templates.py) and applied when it loads; these come beside it.

Opening the model applies them and says so in words; a value that no longer makes sense (a preset since
deleted, a context length of -5, an edited database) is named in that sentence and ignored, never applied.
"Use the global defaults" puts back the options the window had before a model's defaults were applied and
forgets that model's defaults.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine import INT32_MAX

if TYPE_CHECKING:
    from app.controllers.engine_host import EngineHost
    from app.state.conversation_list import Library
    from app.state.settings import SettingsState
    from app.state.database.store import Store

log = logging.getLogger(__name__)

DEFAULTS_KEY = "model_defaults"  # {"<backend> <spec>": {"model": name, "preset": .., "n_ctx": .., "system_prompt": ..}}
GLOBAL_KEY = "model_defaults_global"  # the options in use before a model's defaults replaced them


def model_key(spec: str | None, backend: str) -> str:
    return f"{backend or 'auto'} {spec or 'default'}"


@dataclass(frozen=True)
class ModelDefaults:
    preset: str | None = None
    n_ctx: int | None = None
    system_prompt: str | None = None

    def to_dict(self, model: str) -> dict[str, Any]:
        return {"model": model, "preset": self.preset, "n_ctx": self.n_ctx, "system_prompt": self.system_prompt}


def _all(store: Store) -> dict[str, Any]:
    rows = store.get_setting(DEFAULTS_KEY, {})
    return dict(rows) if isinstance(rows, dict) else {}


def save_defaults(store: Store, spec: str | None, backend: str, model: str, defaults: ModelDefaults) -> None:
    rows = _all(store)
    rows[model_key(spec, backend)] = defaults.to_dict(model)
    store.put_setting(DEFAULTS_KEY, rows)


def has_defaults(store: Store, spec: str | None, backend: str) -> bool:
    return model_key(spec, backend) in _all(store)


def read_defaults(store: Store, spec: str | None, backend: str,
                  preset_names: list[str]) -> tuple[ModelDefaults | None, list[str]]:
    """The model's saved defaults that make sense, and a phrase for each stored value that does not (ignored)."""
    entry = _all(store).get(model_key(spec, backend))
    if entry is None:
        return None, []
    if not isinstance(entry, dict):
        return ModelDefaults(), [f"its saved defaults are not readable ({type(entry).__name__})"]
    problems: list[str] = []
    preset, n_ctx, prompt = entry.get("preset"), entry.get("n_ctx"), entry.get("system_prompt")
    if preset is not None and preset not in preset_names:
        problems.append(f"the preset {preset!r} is not there any more")
        preset = None
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not 1 <= n_ctx <= INT32_MAX):
        problems.append(f"a context length of {n_ctx!r} is not a number of tokens")
        n_ctx = None
    if prompt is not None and not isinstance(prompt, str):
        problems.append("the saved system prompt is not text")
        prompt = None
    return ModelDefaults(preset, n_ctx, prompt), problems


def applied_text(model: str, defaults: ModelDefaults, problems: list[str]) -> str:
    """The status bar's sentence: "SmolLM2-135M-Instruct: its saved defaults applied (preset Balanced, context 4096)"."""
    parts = ([f"preset {defaults.preset}"] if defaults.preset else []) + (
        [f"context {defaults.n_ctx}"] if defaults.n_ctx else []) + (
        ["its system prompt"] if defaults.system_prompt else [])
    text = f"{model}: its saved defaults applied ({', '.join(parts)})" if parts else f"{model}: none of its saved defaults applied"
    if problems:
        text += "; ignored: " + "; ".join(problems)
    return text


def apply_defaults(store: Store, settings: SettingsState, defaults: ModelDefaults) -> None:
    """Apply the preset (keeping the options in use before, once, for "Use the global defaults")."""
    if defaults.preset is None:
        return
    if store.get_setting(GLOBAL_KEY) is None:
        store.put_setting(GLOBAL_KEY, {"options": settings.options.to_dict(), "preset": settings.matching_preset()})
    settings.apply_preset(defaults.preset)


def use_global(store: Store, settings: SettingsState, spec: str | None, backend: str) -> bool:
    """Forget the model's defaults and put back the options in use before any were applied; False if it had none."""
    from app.state.settings import GenerationOptions

    rows = _all(store)
    had = rows.pop(model_key(spec, backend), None) is not None
    store.put_setting(DEFAULTS_KEY, rows)
    saved = store.get_setting(GLOBAL_KEY)
    if isinstance(saved, dict):
        try:
            preset = saved.get("preset")
            if isinstance(preset, str) and preset in settings.preset_names():
                settings.apply_preset(preset)
            settings.set_options(GenerationOptions.from_dict(saved["options"]))
        except (KeyError, TypeError, ValueError) as e:
            log.warning("the global options kept before a model's defaults cannot be read: %s", e)
        store.put_setting(GLOBAL_KEY, None)
    return had


# -- the window's uses (the host and library typed only: this module stays Qt-free) -----------------------------

def save_for_loaded(library: Library, host: EngineHost, preset: str) -> None:
    """Save `preset`, the loaded model's context length and the open chat's system prompt as its defaults."""
    if host.info is None:
        return
    conv = library.current
    save_defaults(library.store, host.spec, host.backend, host.info.name, ModelDefaults(
        preset, host.info.context_length or None, (conv.system_prompt or None) if conv is not None else None))


def context_for(store: Store, spec: str | None, backend: str, preset_names: list[str]) -> int | None:
    """The context length the model's defaults ask for at load (None: none saved, or not a sensible one)."""
    defaults, _problems = read_defaults(store, spec, backend, preset_names)
    return None if defaults is None else defaults.n_ctx


def on_loaded(library: Library, settings: SettingsState, host: EngineHost) -> str | None:
    """Apply the loaded model's saved defaults (its preset; its system prompt to an empty open chat); the
    status bar's sentence, or None when it has none."""
    if host.info is None:
        return None
    defaults, problems = read_defaults(library.store, host.spec, host.backend, settings.preset_names())
    if defaults is None:
        return None
    apply_defaults(library.store, settings, defaults)
    conv = library.current
    if defaults.system_prompt and conv is not None and not conv.messages:
        conv.set_system_prompt(defaults.system_prompt)
    return applied_text(host.info.name, defaults, problems)


def back_to_global(store: Store, settings: SettingsState, host: EngineHost) -> str:
    name = host.info.name if host.info is not None else "the model"
    if use_global(store, settings, host.spec, host.backend):
        return f"{name}: its saved defaults forgotten; the global defaults are in use"
    return f"{name} has no saved defaults: the global defaults are in use"
