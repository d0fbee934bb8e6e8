"""`logitlab-cli models` lists what the library finds in a temporary home; `logitlab-cli pull` downloads from a
real HTTP server on 127.0.0.1 with a progress bar, and says each failure in one line (exit status 2)."""

from __future__ import annotations

import json

import pytest

from download_server import DownloadServer, Served, closed_port
from engine.cli.main import main
from library_layouts import lmstudio_model, ollama_model, put_gguf

STORE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "XDG_DATA_HOME", "OLLAMA_MODELS", "LLAMA_CACHE",
                   "LOGITLAB_MODEL_FOLDERS", "HF_HUB_OFFLINE")


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LOGITLAB_MODELS_DIR", str(home / "logitlab-models"))
    monkeypatch.setenv("LOGITLAB_CACHE_DIR", str(tmp_path / "cache"))
    return home


def test_models_lists_every_store_with_what_to_open(home, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOGITLAB_DEFAULT_MODEL", str(put_gguf(tmp_path / "default" / "Default-Q4.gguf", seed=3)))
    lmstudio_model(home, "pub", "Tiny-GGUF", "Tiny-Q8_0.gguf", n_ctx=512)
    ollama_model(home / ".ollama" / "models", "tiny", "latest", put_gguf(tmp_path / "o.gguf", seed=1).read_bytes())
    put_gguf(tmp_path / "extra" / "mine.gguf", seed=2)
    assert main(["models", "--folder", str(tmp_path / "extra")]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "ARCH", "PARAMS", "QUANT", "SIZE", "CONTEXT", "MEMORY", "BACKEND"]
    assert any(line.startswith("pub/Tiny-GGUF") and "LM Studio" in line and "512" in line for line in lines)
    blob_line = next(i for i, line in enumerate(lines) if line.startswith("tiny:latest"))
    assert lines[blob_line + 1].strip().startswith(f"open: --model {home / '.ollama' / 'models' / 'blobs'}/sha256-")
    assert any(line.startswith("Default-Q4") and "Logit Lab" in line for line in lines)  # the default model
    assert "4 models" in err and "memory" in err

    assert main(["models", "--json", "--search", "ollama"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["name"], r["source"], r["architecture"]) for r in rows] == [("tiny:latest", "ollama", "llama")]


def test_pull_an_address_shows_progress_and_prints_what_to_open(home, tmp_path, capsys):
    data = put_gguf(tmp_path / "t.gguf").read_bytes()
    with DownloadServer() as server:
        server.files["/t.gguf"] = Served(data)
        assert main(["pull", server.url("/t.gguf")]) == 0
    out, err = capsys.readouterr()
    target = home / "logitlab-models" / "t.gguf"
    assert out.strip() == str(target) and target.read_bytes() == data
    assert "100%" in err and "of" in err and f"--model {target}" in err


@pytest.mark.parametrize("what", ["address", "hub"])
def test_pull_network_failures_are_one_line_and_status_1_not_a_usage_error(home, capsys, monkeypatch, what):
    port = closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with DownloadServer() as server:
        spec = server.url("/missing.gguf") if what == "address" else "org/model"
        assert main(["pull", spec]) == 1  # the command was right: pulling again may work
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert ("HTTP 404" in err) if what == "address" else ("cannot be reached" in err)


def test_pull_refuses_what_it_cannot_download_before_any_request(home, capsys):
    assert main(["pull", "http://127.0.0.1:9/model.bin"]) == 2
    assert "does not name a .gguf file" in capsys.readouterr().err
