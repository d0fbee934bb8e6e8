"""`pull` through huggingface_hub against a hub served on 127.0.0.1 (tests/download_server.py add_hub_repo):
files land in the Hugging Face cache's own layout and the library lists them; checksums, choices among
GGUF files, cancel and resume, an unreachable hub and a missing repository are each one clear error.
"""

from __future__ import annotations

import json
import time

import pytest

from download_server import DownloadServer, Served, add_hub_repo, closed_port
from engine.errors import HubUnreachableError, ModelNotFoundError, UsageError
from engine.library import scan
from engine.library.errors import ChecksumMismatchError, DownloadCancelled, DownloadError
from engine.library.facts_cache import FactsCache
from engine.library.locations import Location
from engine.library.memory import MachineMemory
from engine.library.progress import CancelToken
from engine.library.pull import parse_pull, pull
from library_layouts import TINY_CONFIG, put_gguf, safetensors_bytes, tiny_llama_tensors

PLENTY = dict(free_space=lambda _f: 10**12)
COMMIT = "c" * 40


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    return put_gguf(tmp_path_factory.mktemp("g") / "t.gguf").read_bytes()


@pytest.fixture
def hub(monkeypatch):
    with DownloadServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def _listed(cache, tmp_path):
    result = scan([Location("huggingface", cache, "huggingface")], cache=FactsCache(tmp_path / "f.json"),
                  machine=MachineMemory(2**36, 2**35), backends={"gguf": "llamacpp", "safetensors": "torch"})
    return result.entries


def test_a_gguf_by_quantization_lands_in_the_hub_cache_and_the_library_lists_it(hub, tmp_path, gguf_bytes):
    add_hub_repo(hub, "org/tiny-GGUF", {"tiny-Q4_K_M.gguf": gguf_bytes, "tiny-F32.gguf": gguf_bytes[:-1] + b"x",
                                        "README.md": b"# tiny"})
    seen = []
    result = pull("org/tiny-GGUF:q4_k_m", cache_dir=tmp_path / "hub", progress=seen.append, **PLENTY)
    assert result.path == tmp_path / "hub" / "models--org--tiny-GGUF" / "snapshots" / COMMIT / "tiny-Q4_K_M.gguf"
    assert result.path.is_symlink() and result.path.read_bytes() == gguf_bytes
    assert seen[-1].done_bytes == seen[-1].total_bytes == len(gguf_bytes)
    (entry,) = _listed(tmp_path / "hub", tmp_path)
    assert entry.name == "tiny-Q4_K_M" and entry.spec == result.spec and entry.facts.architecture == "llama"


def test_a_safetensors_model_is_fetched_as_the_engine_loads_it_and_opens_by_hub_id(hub, tmp_path):
    files = {"config.json": json.dumps(TINY_CONFIG).encode(), "model.safetensors": safetensors_bytes(tiny_llama_tensors()),
             "pytorch_model.bin": b"old format, not fetched"}
    add_hub_repo(hub, "org/tiny-llama", files)
    result = pull("org/tiny-llama", cache_dir=tmp_path / "hub", **PLENTY)
    assert result.spec == "org/tiny-llama"
    assert sorted(p.name for p in result.path.iterdir()) == ["config.json", "model.safetensors"]
    (entry,) = _listed(tmp_path / "hub", tmp_path)
    assert entry.spec == "org/tiny-llama" and entry.format == "safetensors"


def test_a_repo_of_several_gguf_models_asks_which_one_by_name(hub, tmp_path, gguf_bytes):
    add_hub_repo(hub, "org/many", {"m-Q4_0.gguf": gguf_bytes, "m-Q8_0.gguf": gguf_bytes,
                                   "m-F16-00001-of-00002.gguf": gguf_bytes, "m-F16-00002-of-00002.gguf": b"rest"})
    with pytest.raises(DownloadError, match="holds 3 GGUF models; choose one") as e:
        pull("org/many", cache_dir=tmp_path / "hub", **PLENTY)
    assert "org/many/m-Q8_0.gguf" in str(e.value)
    parts = pull("org/many:f16", cache_dir=tmp_path / "hub", **PLENTY)  # a split model: every part
    snapshot = parts.path.parent
    assert parts.path.name == "m-F16-00001-of-00002.gguf" and (snapshot / "m-F16-00002-of-00002.gguf").read_bytes() == b"rest"


def test_a_file_whose_hash_differs_from_the_published_one_is_deleted(hub, tmp_path, gguf_bytes):
    add_hub_repo(hub, "org/bad", {"bad.gguf": gguf_bytes}, wrong_sha256={"bad.gguf"})
    with pytest.raises(ChecksumMismatchError, match="damaged"):
        pull("org/bad", cache_dir=tmp_path / "hub", **PLENTY)
    repo = tmp_path / "hub" / "models--org--bad"
    assert not (repo / "snapshots" / COMMIT / "bad.gguf").exists()
    assert [p for p in (repo / "blobs").iterdir() if p.stat().st_size == len(gguf_bytes)] == []


@pytest.mark.slow
def test_a_dropped_connection_during_a_hub_download_resumes_with_range(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    # huggingface_hub resumes from the last whole chunk it wrote (10 MB by default; smaller for a small file).
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256 * 1024)
    big = b"GGUF" + bytes(3_000_000)
    add_hub_repo(hub, "org/big", {"big.gguf": big})
    hub.files[f"/org/big/resolve/{COMMIT}/big.gguf"].drop_after = 1_000_000
    result = pull("org/big", cache_dir=tmp_path / "hub", **PLENTY)
    assert result.path.read_bytes() == big
    resumed = [r for p, r in hub.requests if p.endswith("/big.gguf") and r]
    assert resumed == [f"bytes={3 * 256 * 1024}-"]


def test_cancel_stops_a_hub_download_and_leaves_nothing_half_written(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256 * 1024)  # its 10 MB chunks would swallow this file whole
    big = b"GGUF" + bytes(3_000_000)
    add_hub_repo(hub, "org/big", {"big.gguf": big})
    cancel = CancelToken()
    with pytest.raises(DownloadCancelled):
        pull("org/big", cache_dir=tmp_path / "hub", cancel=cancel, progress=lambda p: cancel.cancel(), **PLENTY)
    repo = tmp_path / "hub" / "models--org--big"
    # huggingface_hub (2.x) deletes its partial file on failure: no blob, no link the library would list.
    assert list((repo / "blobs").iterdir()) == [] and not _listed(tmp_path / "hub", tmp_path)
    assert pull("org/big", cache_dir=tmp_path / "hub", **PLENTY).path.read_bytes() == big


def test_not_enough_space_for_a_hub_model_is_said_before_downloading(hub, tmp_path, gguf_bytes):
    add_hub_repo(hub, "org/tiny", {"t.gguf": gguf_bytes})
    with pytest.raises(DownloadError, match="not enough free space"):
        pull("org/tiny", cache_dir=tmp_path / "hub", free_space=lambda _f: 1000, reserve_bytes=0)
    assert not any(path.endswith("t.gguf") for path, _r in hub.requests)


@pytest.mark.timeout(60)
def test_an_unreachable_hub_is_one_clear_message_within_seconds(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(HubUnreachableError, match="cannot be reached") as e:
        pull("org/anything", cache_dir=tmp_path / "hub", **PLENTY)
    assert time.monotonic() - start < 30
    assert "\n" not in str(e.value) and "org/anything" in str(e.value)


def test_a_repository_the_hub_does_not_have_is_one_error(hub, tmp_path):
    with pytest.raises(ModelNotFoundError, match="no model 'org/missing' on the hub") as e:
        pull("org/missing", cache_dir=tmp_path / "hub", **PLENTY)
    assert "\n" not in str(e.value)


def test_a_gguf_address_downloads_into_the_models_folder(tmp_path, gguf_bytes):
    with DownloadServer() as server:
        server.files["/files/tiny.gguf"] = Served(gguf_bytes)
        result = pull(server.url("/files/tiny.gguf"), models_folder=tmp_path / "models", **PLENTY)
    assert result.path == tmp_path / "models" / "tiny.gguf" and result.path.read_bytes() == gguf_bytes


def test_what_pull_accepts_and_what_it_refuses():
    assert parse_pull("https://huggingface.co/org/r/resolve/main/sub/f.gguf").__dict__ | {} == {
        "kind": "hub", "repo_id": "org/r", "filename": "sub/f.gguf", "tag": "", "revision": "main", "url": ""}
    assert parse_pull("org/r/f-Q4_0.gguf").filename == "f-Q4_0.gguf"
    assert parse_pull("org/r:Q4_0").tag == "Q4_0"
    assert parse_pull("http://example.org/x.gguf").kind == "url"
    for bad in ("http://example.org/model.bin", "just-a-name", "org/r/readme.md"):
        with pytest.raises(UsageError):
            parse_pull(bad)
