"""Servers the user connects to: recent ones (in the settings store, without keys), API keys, what a server can do.

API keys go to the OS keyring when the `keyring` package imports; otherwise they
are kept in this process's memory for the session only. A key is never written
to the SQLite store or a log line: the recent-servers list holds URL, model and
timeout only. Credentials typed into a URL (`http://user:secret@host/v1`) are
kept the same way, beside the key (`prepare_connection` takes them out of the
spec, so the model's spec, the recent lists and the status bar never hold them).
"""

from __future__ import annotations

import logging
from typing import Any

from engine import ModelInfo, split_server_spec
from engine import split_server_credentials

from app.state.database.store import Store

log = logging.getLogger(__name__)

RECENT_SERVERS_KEY = "recent_servers"
MAX_RECENT_SERVERS = 10
KEYRING_SERVICE = "logitlab"
CREDENTIALS_PREFIX = "url credentials "  # keyring user name of a base URL's credentials (beside its API key)
DEFAULT_TIMEOUT_S = 60.0


def recent_servers(store: Store) -> list[dict[str, Any]]:
    """Most recent first: [{"url": base URL, "model": id, "timeout_s": seconds}]."""
    rows = store.get_setting(RECENT_SERVERS_KEY, [])
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("url"), str)]


def remember_server(store: Store, url: str, model: str, timeout_s: float) -> None:
    base, _ = split_server_spec(url)
    rows = [r for r in recent_servers(store) if r["url"] != base]
    row = {"url": base, "model": model, "timeout_s": float(timeout_s)}  # never the key
    store.put_setting(RECENT_SERVERS_KEY, [row] + rows[: MAX_RECENT_SERVERS - 1])


class ApiKeys:
    """API keys by base URL: the OS keyring when available, else this session's memory."""

    def __init__(self, use_keyring: bool = True):
        self._session: dict[str, str] = {}
        self._keyring = None
        if use_keyring:
            try:
                import keyring  # optional: not a dependency of the app

                self._keyring = keyring
            except ImportError:
                log.info("the keyring package is not installed: API keys are kept for this session only")

    @property
    def persistent(self) -> bool:
        """True when keys outlive the session (the OS keyring)."""
        return self._keyring is not None

    def get(self, url: str) -> str | None:
        base, _ = split_server_spec(url)
        return self._read(base)

    def set(self, url: str, key: str | None, remember: bool = True) -> None:
        """Keep `key` for `url` (None or "" forgets it); `remember`: also in the OS keyring when there is one."""
        base, _ = split_server_spec(url)
        self._write(base, key, remember)

    def get_credentials(self, url: str) -> str | None:
        """The "user:password" typed into `url`'s address once, kept like its key."""
        base, _ = split_server_spec(url)
        return self._read(CREDENTIALS_PREFIX + base)

    def set_credentials(self, url: str, credentials: str | None, remember: bool = True) -> None:
        base, _ = split_server_spec(url)
        self._write(CREDENTIALS_PREFIX + base, credentials, remember)

    def _read(self, name: str) -> str | None:
        if name in self._session:
            return self._session[name]
        if self._keyring is not None:
            try:
                return self._keyring.get_password(KEYRING_SERVICE, name)
            except Exception as e:  # noqa: BLE001 - a locked or missing keyring backend: just no saved key
                log.warning("could not read the key for %s from the keyring: %s", name, type(e).__name__)
        return None

    def _write(self, name: str, secret: str | None, remember: bool) -> None:
        if not secret:
            self._session.pop(name, None)
            self._forget_persistent(name)
            return
        self._session[name] = secret
        if remember and self._keyring is not None:
            try:
                self._keyring.set_password(KEYRING_SERVICE, name, secret)
            except Exception as e:  # noqa: BLE001 - the session copy still works
                log.warning("could not save the key for %s in the keyring: %s", name, type(e).__name__)

    def _forget_persistent(self, base: str) -> None:
        if self._keyring is None:
            return
        try:
            if self._keyring.get_password(KEYRING_SERVICE, base) is not None:
                self._keyring.delete_password(KEYRING_SERVICE, base)
        except Exception as e:  # noqa: BLE001
            log.warning("could not remove the key for %s from the keyring: %s", base, type(e).__name__)


def server_samples(server_sampling: bool, info: ModelInfo | None) -> bool:
    """Whether the next answer is sampled by the server: the user's choice on a remote model, forced on a server
    that cannot do we-sample mode, never on a local model."""
    if info is None or info.server is None:
        return False
    return server_sampling or not info.server.we_sample_ok


def prepare_connection(store: Store, keys: ApiKeys, spec: str) -> str:
    """Before a server spec loads (the dialog, Model ▸ Recent, the last model at start-up): give the engine
    the key and URL credentials (keyring or session) and the timeout saved for it. Without them, the engine's
    defaults and $LOGITLAB_API_KEY apply.

    Returns the spec to load, show and store: without the credentials its URL held, which are kept with the
    key instead.
    """
    from engine import remember_connection

    clean, typed = split_server_credentials(spec)
    base, _ = split_server_spec(clean)
    if typed:
        keys.set_credentials(base, typed)
    recent = next((r for r in recent_servers(store) if r["url"] == base), None)
    key = keys.get(base)
    credentials = keys.get_credentials(base)
    if key or credentials or recent is not None:
        remember_connection(base, api_key=key, credentials=credentials,
                            timeout_s=recent.get("timeout_s") if recent else None)
    return clean
