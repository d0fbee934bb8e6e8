"""The runtime settings (context, threads, GPU layers, batch size) the user chose for each model, kept in the store.

Kept per model spec and the backend it was opened with (as Model ▸ Recent
remembers them): the same file opened another way may not take the same
settings. Only the settings the user set are kept; a model with none loads
with the engine's choices. A saved value that no longer checks (an older
version's, an edited database) is dropped with a warning in the log rather
than stopping the model from loading.
"""

from __future__ import annotations

import logging

from engine import RuntimeSettings

from app.state.database.store import Store

log = logging.getLogger(__name__)

RUNTIME_KEY = "runtime_settings"  # {"<backend> <spec>": {"n_ctx": 4096, ...}}


def _key(spec: str | None, backend: str) -> str:
    return f"{backend or 'auto'} {spec or 'default'}"


def saved_runtime(store: Store, spec: str | None, backend: str) -> RuntimeSettings:
    """The settings chosen for `spec` opened with `backend`; all None (the engine's choices) when none were."""
    rows = store.get_setting(RUNTIME_KEY, {})
    values = rows.get(_key(spec, backend)) if isinstance(rows, dict) else None
    if not isinstance(values, dict):
        return RuntimeSettings()
    try:
        return RuntimeSettings.from_dict(values)
    except (TypeError, ValueError) as e:
        log.warning("ignoring the saved runtime settings of %s: %s", spec or "the default model", e)
        return RuntimeSettings()


def remember_runtime(store: Store, spec: str | None, backend: str, settings: RuntimeSettings) -> None:
    """Keep `settings` for `spec` and `backend`; settings that are all the engine's choices forget the entry."""
    rows = store.get_setting(RUNTIME_KEY, {})
    rows = dict(rows) if isinstance(rows, dict) else {}
    values = settings.load_kwargs()
    if values:
        rows[_key(spec, backend)] = values
    else:
        rows.pop(_key(spec, backend), None)
    store.put_setting(RUNTIME_KEY, rows)
