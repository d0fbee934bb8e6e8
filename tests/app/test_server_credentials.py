"""Credentials typed into a server URL live where the API key lives, never in the database (issue 20 item 19)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.remote import RemoteBackend
from remote_server import CharModel, FakeServer

from app.state.models.servers import ApiKeys, prepare_connection, recent_servers, remember_server
from app.state.database.store import Store

SECRET = "sk-very-secret-123"
URL = f"http://alice:{SECRET}@127.0.0.1:8080/v1#tiny"


def test_prepare_connection_keeps_credentials_with_the_key_and_returns_a_clean_spec(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    keys = ApiKeys(use_keyring=False)
    spec = prepare_connection(store, keys, URL)
    assert spec == "http://127.0.0.1:8080/v1#tiny"
    assert keys.get_credentials("http://127.0.0.1:8080/v1") == f"alice:{SECRET}"
    assert keys.get("http://127.0.0.1:8080/v1") is None  # the API key is another thing
    # Loading the clean spec later (the recent list, start-up) finds them again.
    assert prepare_connection(store, keys, spec) == spec
    store.close()


@pytest.mark.slow
def test_nothing_with_credentials_reaches_the_database_or_its_wal(tmp_path):
    """What a connected server model records (its ModelInfo) and every list the app keeps, written to disk."""
    server = FakeServer(CharModel({"a": 0.6, "b": 0.3}))
    url = server.url.replace("http://", f"http://alice:{SECRET}@") + "#char-model"
    backend = RemoteBackend.connect(url)
    try:
        info = backend.info
        assert server.auth[-1].startswith("Basic ")  # the credentials are used, as Basic auth
        assert SECRET not in repr(info.to_dict()) and SECRET not in "\n".join(info.summary_lines())
    finally:
        backend.close()
        server.close()
    store = Store(tmp_path / "db.sqlite")
    remember_server(store, url, "char-model", 60.0)
    store.put_setting("recent_models", [{"spec": url, "backend": "remote"}])  # a caller that forgot to clean it
    conv = store.create_conversation("chat")
    message = store.insert_message(conv.id, None, "assistant", "hi", model=info.to_dict(), request={"note": url})
    store.update_message(message.id, model={"spec": url})
    assert SECRET not in recent_servers(store)[0]["url"]
    on_disk = b"".join(p.read_bytes() for p in Path(tmp_path).iterdir() if p.is_file())
    assert SECRET.encode() not in on_disk and b"127.0.0.1:" in on_disk
    store.close()
