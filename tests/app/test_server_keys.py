"""API keys: the OS keyring when `keyring` imports, else this session only; recent servers never hold a key."""

from __future__ import annotations

import sys
import types

from app.state.models.servers import KEYRING_SERVICE, ApiKeys, prepare_connection, recent_servers, remember_server


def _fake_keyring() -> types.ModuleType:
    """The three calls of the `keyring` package we use, over a dict (the package is optional, often absent)."""
    mod = types.ModuleType("keyring")
    saved: dict[tuple[str, str], str] = {}
    mod.saved = saved
    mod.get_password = lambda service, user: saved.get((service, user))
    mod.set_password = lambda service, user, password: saved.__setitem__((service, user), password)
    mod.delete_password = lambda service, user: saved.pop((service, user))
    return mod


def test_keys_go_to_the_keyring_by_base_url(monkeypatch):
    ring = _fake_keyring()
    monkeypatch.setitem(sys.modules, "keyring", ring)
    keys = ApiKeys()
    assert keys.persistent
    keys.set("http://127.0.0.1:8000", "sk-1")
    assert ring.saved == {(KEYRING_SERVICE, "http://127.0.0.1:8000/v1"): "sk-1"}
    assert ApiKeys().get("http://127.0.0.1:8000/v1#some-model") == "sk-1"  # a new session reads it back
    keys.set("http://127.0.0.1:8000/v1", "sk-2", remember=False)  # this session only
    assert keys.get("http://127.0.0.1:8000/v1") == "sk-2" and ring.saved[(KEYRING_SERVICE, "http://127.0.0.1:8000/v1")] == "sk-1"
    keys.set("http://127.0.0.1:8000/v1", None)
    assert ring.saved == {} and keys.get("http://127.0.0.1:8000/v1") is None


def test_without_keyring_keys_last_for_the_session_and_never_reach_the_store(monkeypatch, store):
    monkeypatch.setitem(sys.modules, "keyring", None)  # `import keyring` raises ImportError
    keys = ApiKeys()
    assert not keys.persistent
    keys.set("http://127.0.0.1:9/v1", "sk-session")
    assert keys.get("http://127.0.0.1:9/v1") == "sk-session" and ApiKeys().get("http://127.0.0.1:9/v1") is None
    remember_server(store, "http://127.0.0.1:9", "m", 12.0)
    assert recent_servers(store) == [{"url": "http://127.0.0.1:9/v1", "model": "m", "timeout_s": 12.0}]
    prepare_connection(store, keys, "http://127.0.0.1:9/v1#m")  # hands key and timeout to the engine

    from engine.backends.remote.options import options_for

    opts = options_for("http://127.0.0.1:9/v1#m")
    assert opts.api_key == "sk-session" and opts.timeout_s == 12.0 and "sk-session" not in repr(opts)
