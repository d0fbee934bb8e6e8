"""Model specs resolve to the right thing, and bad ones fail fast with a clear message."""

from __future__ import annotations

import json
import time

import pytest

from engine.errors import HubUnreachableError, ModelLoadError, ModelNotFoundError
from engine.sources import gguf_convert, materialize, resolve_spec
from engine.sources.default_model import DEFAULT_FILE


@pytest.mark.model
def test_default_spec_finds_the_packaged_gguf():
    source = resolve_spec(None)
    assert source.kind == "default"
    assert source.path.name == DEFAULT_FILE and source.path.is_file()


def test_folder_gguf_and_hub_specs_are_classified(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve_spec(str(folder)).kind == "folder"
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF....")
    assert resolve_spec(str(gguf)).kind == "gguf"
    assert resolve_spec("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hub"


@pytest.mark.parametrize("spec", ["/no/such/model", "./missing-folder", "missing.gguf", "not a model"])
def test_missing_paths_name_the_spec(spec):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_spec(spec)
    assert spec.strip() in str(err.value)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_spec(str(tmp_path))


def test_non_gguf_bytes_are_rejected_before_any_work(tmp_path, isolated_cache):
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        materialize(resolve_spec(str(bad)))


@pytest.mark.model
def test_truncated_gguf_gives_a_load_error_and_leaves_no_folder(tmp_path, isolated_cache):
    real = resolve_spec(None).path
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(real.read_bytes()[: 1 << 20])  # right magic, cut in the middle of the tensors
    with pytest.raises(ModelLoadError, match="truncated.gguf"):
        materialize(resolve_spec(str(bad)))
    converted = isolated_cache / "converted"
    assert not converted.exists() or not any(p.name.startswith("truncated") for p in converted.iterdir())


def test_interrupted_conversion_is_never_trusted(tmp_path, isolated_cache, monkeypatch, tiny_gguf):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(tiny_gguf.read_bytes())  # a real header: the conversion checks it before anything else

    def crash(path, out):
        (out / "config.json").write_text("{}")  # half written...
        raise KeyboardInterrupt  # ...then the user quits

    monkeypatch.setattr(gguf_convert, "_convert", crash)
    with pytest.raises(KeyboardInterrupt):
        gguf_convert.ensure_converted(gguf)
    target = gguf_convert.converted_dir_for(gguf)
    assert not target.exists()
    assert not [p for p in target.parent.iterdir() if p.is_dir()]  # temp folder cleaned up too

    # A leftover folder without the completion marker (e.g. after a power cut) is replaced.
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")

    def ok(path, out):
        (out / "config.json").write_text('{"ok": true}')

    monkeypatch.setattr(gguf_convert, "_convert", ok)
    assert json.loads((gguf_convert.ensure_converted(gguf) / "config.json").read_text()) == {"ok": True}


def test_converted_default_model_has_rope_theta_for_mlx(default_model_folder):
    config = json.loads((default_model_folder / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert (default_model_folder / gguf_convert.COMPLETE_MARKER).is_file()
    assert "quantization_config" not in config


def test_offline_hub_id_fails_fast_naming_the_spec(isolated_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no local copy to fall back on
    import huggingface_hub.constants

    # The hub is unreachable, whatever this machine's network (read at request time).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(HubUnreachableError) as err:
        materialize(resolve_spec("nobody-here/no-such-model"))
    assert time.monotonic() - start < 10
    assert "nobody-here/no-such-model" in str(err.value)
