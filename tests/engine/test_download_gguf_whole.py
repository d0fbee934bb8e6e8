"""A downloaded GGUF is named only when it reaches as far as its own header says (issue 43 item 12).

Against a real HTTP server on 127.0.0.1 (tests/download_server.py) serving a real GGUF (tests/tiny_gguf.py):
a Content-Length half the real one that the server stands by (it ignores Range, so nothing else contradicts
it), a Content-Length longer than the file, a file cut short on the server and served honestly (its
checksum made of the short bytes, so it matches), and the same cut file through the hub's own download code.
Each is one error in words, and nothing is left where the library would list it as a model.
"""

from __future__ import annotations

import pytest

from download_server import DownloadServer, Served, add_hub_repo
from engine.library.errors import DownloadError, DownloadInterrupted
from engine.library.http_download import download_url
from tiny_gguf import write_tiny_llama_gguf

PLENTY = lambda _folder: 10**12  # noqa: E731 (free space of a big disk)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> bytes:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("whole") / "tiny.gguf").read_bytes()


@pytest.fixture
def server():
    with DownloadServer() as s:
        yield s


def _download(server, tmp_path, served: Served, **kw):
    server.files["/m.gguf"] = served
    kw.setdefault("free_space", PLENTY)
    return download_url(server.url("/m.gguf"), tmp_path / "m.gguf", **kw)


def _nothing_named(tmp_path) -> bool:
    from engine.library import scan
    from engine.library.facts_cache import FactsCache
    from engine.library.locations import Location
    from engine.library.memory import MachineMemory

    listed = scan([Location("logitlab", tmp_path, "files")], cache=FactsCache(tmp_path.parent / f"{tmp_path.name}.json"),
                  machine=MachineMemory(2**36, 2**35), backends={"gguf": "llamacpp", "safetensors": "torch"})
    return not (tmp_path / "m.gguf").exists() and not listed.entries


def test_a_whole_gguf_downloads_and_is_named(server, tmp_path, gguf):
    assert _download(server, tmp_path, Served(gguf, publish_sha256=None, honour_range=False)).read_bytes() == gguf


def test_half_the_content_length_stood_by_is_caught_by_the_header(server, tmp_path, gguf):
    half = len(gguf) // 2
    with pytest.raises(DownloadError) as e:
        _download(server, tmp_path, Served(gguf, declared_length=half, publish_sha256=None, honour_range=False))
    message = str(e.value)
    assert "m.gguf is incomplete" in message and f"sent {half:,} bytes" in message
    assert f"the file has {half:,}" in message and "was deleted" in message
    assert _nothing_named(tmp_path) and not (tmp_path / "m.gguf.part").exists()


def test_a_content_length_longer_than_the_file_is_never_named(server, tmp_path, gguf):
    import httpx

    with httpx.Client(timeout=2.0) as client:
        with pytest.raises(DownloadError, match="disagree"):  # the resume finds the file ends before the stated size
            _download(server, tmp_path, Served(gguf, declared_length=2 * len(gguf), publish_sha256=None),
                      client=client, retries=1)
        assert _nothing_named(tmp_path)
        with pytest.raises(DownloadInterrupted):  # a server that cannot resume: the part waits, unnamed
            _download(server, tmp_path, Served(gguf, declared_length=2 * len(gguf), publish_sha256=None,
                                               honour_range=False), client=client, retries=1)
    assert _nothing_named(tmp_path)


def test_a_file_cut_short_on_the_server_and_served_honestly_is_refused(server, tmp_path, gguf):
    cut = gguf[: len(gguf) * 3 // 4]
    with pytest.raises(DownloadError, match="m.gguf is incomplete") as e:
        _download(server, tmp_path, Served(cut))  # its checksum is published for the cut bytes: it matches
    assert f"tensors need {len(gguf):,} bytes" in str(e.value) or "tensors need" in str(e.value)
    assert _nothing_named(tmp_path) and not (tmp_path / "m.gguf.part").exists()


def test_the_cli_pull_of_a_half_length_gguf_is_one_line_and_no_model(server, tmp_path, gguf, monkeypatch, capsys):
    from engine.__main__ import main

    models = tmp_path / "models"
    monkeypatch.setenv("LOGITLAB_MODELS_DIR", str(models))
    server.files["/half.gguf"] = Served(gguf, declared_length=len(gguf) // 2, publish_sha256=None, honour_range=False)
    assert main(["pull", server.url("/half.gguf")]) != 0
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert "Traceback" not in err and "downloaded to" not in err and out == ""
    assert len(lines) == 1 and "half.gguf is incomplete" in lines[0]
    assert not any(models.glob("half.gguf*"))


def test_a_cut_gguf_through_the_hub_is_deleted_from_the_cache(tmp_path, gguf, monkeypatch):
    from engine.library.pull import pull

    cut = gguf[: len(gguf) // 2]
    with DownloadServer() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        add_hub_repo(hub, "org/cut-GGUF", {"cut.gguf": cut})  # listing size and SHA-256 both of the cut file
        with pytest.raises(DownloadError, match="cut.gguf is incomplete"):
            pull("org/cut-GGUF", cache_dir=tmp_path / "hub", free_space=PLENTY)
    assert not [p for p in (tmp_path / "hub").rglob("*") if p.is_file() and p.stat().st_size == len(cut)]
