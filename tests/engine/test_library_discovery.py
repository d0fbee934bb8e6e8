"""The model library finds models in real store layouts built in a temporary home, and reads their facts.

Oracles: the `gguf` package's own reader (parameter count, context length)
and numpy's sizes (safetensors parameters); layouts are written the way LM
Studio, Ollama and huggingface_hub write them (tests/library_layouts.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.library import default_locations, scan
from engine.library.facts_cache import FactsCache
from engine.library.locations import Location
from engine.library.memory import MachineMemory
from engine.library.walk import find_models
from engine.sources import resolve_spec
from library_layouts import (
    TINY_CONFIG,
    hf_cache_file,
    hf_cache_folder_model,
    lmstudio_model,
    ollama_model,
    put_gguf,
    tiny_llama_tensors,
)

BIG_MACHINE = MachineMemory(total_bytes=64 * 2**30, available_bytes=32 * 2**30)
BACKENDS = {"gguf": "llamacpp", "safetensors": "torch"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return put_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_ctx=512)


def _scan(locations, tmp_path, machine=BIG_MACHINE):
    return scan(locations, cache=FactsCache(tmp_path / "facts.json"), machine=machine, backends=BACKENDS)


def _home_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "LOGITLAB_MODELS_DIR": str(home / "logitlab-models")}


def _by_name(result):
    return {e.name: e for e in result.entries}


def test_every_store_in_a_linux_home_is_found_with_facts_from_the_header(tmp_path, tiny):
    from gguf import GGUFReader

    home = tmp_path / "home"
    lmstudio_model(home, "bartowski", "Tiny-GGUF", "Tiny-Q8.gguf", template=tiny)
    put_gguf(home / ".cache" / "lm-studio" / "models" / "old" / "repo" / "Old.gguf", seed=1)
    put_gguf(home / ".local" / "share" / "nomic.ai" / "GPT4All" / "gpt4all-tiny.gguf", seed=2)
    put_gguf(home / "jan" / "models" / "tiny-jan" / "model.gguf", seed=3)
    put_gguf(home / ".local" / "share" / "Jan" / "data" / "llamacpp" / "models" / "new-jan" / "model.gguf", seed=4)
    put_gguf(home / ".cache" / "llama.cpp" / "org_repo_cached.gguf", seed=5)
    put_gguf(home / "logitlab-models" / "downloaded.gguf", seed=6)
    ollama_model(home / ".ollama" / "models", "tiny", "latest", put_gguf(tmp_path / "o.gguf", seed=7).read_bytes())
    hub = home / ".cache" / "huggingface" / "hub"
    hf_cache_file(hub, "Org/Tiny-GGUF", "a" * 40, "tiny-F32.gguf", put_gguf(tmp_path / "h.gguf", seed=8).read_bytes())
    hf_cache_folder_model(hub, "Org/tiny-llama", "b" * 40)
    put_gguf(tmp_path / "mine" / "sub" / "my-model.gguf", seed=9)

    locations = default_locations(home=home, platform="linux", env=_home_env(home), extra_folders=[tmp_path / "mine"],
                                  default_model=False)
    result = _scan(locations, tmp_path)
    names = _by_name(result)
    assert {(e.name, e.source) for e in result.entries} == {
        # LM Studio names publisher/repo; Jan's models/<id>/model.gguf is named by its folder.
        ("bartowski/Tiny-GGUF", "lmstudio"), ("old/repo", "lmstudio"), ("gpt4all-tiny", "gpt4all"),
        ("tiny-jan", "jan"), ("new-jan", "jan"),
        ("tiny:latest", "ollama"), ("tiny-F32", "huggingface"), ("Org/tiny-llama", "huggingface"),
        ("org_repo_cached", "llamacpp"), ("downloaded", "logitlab"), ("my-model", "folder"),
    }
    assert sum(1 for e in result.entries if e.source == "jan") == 2  # old ~/jan and the new data folder

    reader = GGUFReader(str(tiny))
    entry = names["bartowski/Tiny-GGUF"]
    assert entry.problem == ""
    assert entry.format == "gguf" and entry.backend == "llamacpp"
    assert entry.facts.architecture == "llama"
    assert entry.facts.parameters == sum(int(t.n_elements) for t in reader.tensors)
    assert entry.facts.context_length == int(reader.fields["llama.context_length"].parts[-1][0]) == 512
    assert entry.facts.quantization == "F32"
    assert entry.file_bytes == tiny.stat().st_size
    assert entry.spec == str(entry.path) and resolve_spec(entry.spec).kind == "gguf"
    assert entry.memory_bytes > entry.file_bytes and entry.fit == "fits"


def test_ollama_manifests_map_each_name_and_tag_to_its_gguf_blob(tmp_path, tiny):
    store = tmp_path / "ollama"
    data = tiny.read_bytes()
    ollama_model(store, "tiny", "latest", data)
    ollama_model(store, "tiny", "q8", put_gguf(tmp_path / "b.gguf", seed=1).read_bytes())
    ollama_model(store, "mymodel", "v1", put_gguf(tmp_path / "c.gguf", seed=2).read_bytes(), namespace="someone")
    ollama_model(store, "tiny-gguf", "Q4_K_M", put_gguf(tmp_path / "d.gguf", seed=3).read_bytes(),
                 namespace="org", host="hf.co")
    result = _scan([Location("ollama", store, "ollama")], tmp_path)
    names = _by_name(result)
    assert set(names) == {"tiny:latest", "tiny:q8", "someone/mymodel:v1", "hf.co/org/tiny-gguf:Q4_K_M"}
    entry = names["tiny:latest"]
    assert entry.path.parent == store / "blobs" and entry.path.name.startswith("sha256-")
    assert entry.path.read_bytes() == data
    assert entry.facts.architecture == "llama" and entry.facts.context_length == 512
    source = resolve_spec(entry.spec)  # a blob has no .gguf extension; the engine opens it by its magic
    assert source.kind == "gguf" and source.path == entry.path.resolve()


def test_an_ollama_manifest_whose_blob_is_missing_is_listed_with_the_reason(tmp_path, tiny):
    store = tmp_path / "ollama"
    ollama_model(store, "gone", "latest", tiny.read_bytes())
    for blob in (store / "blobs").iterdir():
        if blob.stat().st_size == tiny.stat().st_size:
            blob.unlink()
    (entry,) = _scan([Location("ollama", store, "ollama")], tmp_path).entries
    assert entry.name == "gone:latest" and "missing" in entry.problem and entry.fit == "unknown"


def test_the_hub_cache_lists_the_snapshot_refs_main_names_and_reads_safetensors_headers(tmp_path):
    hub = tmp_path / "hub"
    old = dict(TINY_CONFIG, max_position_embeddings=128)
    hf_cache_folder_model(hub, "Org/tiny-llama", "1" * 40, cfg=old)
    os.utime(hub / "models--Org--tiny-llama" / "snapshots" / ("1" * 40), (2e9, 2e9))  # the newer folder on disk
    current = hf_cache_folder_model(hub, "Org/tiny-llama", "2" * 40)
    hf_cache_file(hub, "Org/partial", "3" * 40, "config.json", b"{}")  # no weights yet: not a model
    (entry,) = _scan([Location("huggingface", hub, "huggingface")], tmp_path).entries
    assert entry.name == "Org/tiny-llama" and entry.path == current
    assert entry.spec == "Org/tiny-llama"  # opened by hub id: the engine finds it in the cache, offline
    assert entry.format == "safetensors" and entry.backend == "torch"
    assert entry.facts.parameters == sum(a.size for a in tiny_llama_tensors().values())
    assert entry.facts.quantization == "F16"
    assert entry.facts.context_length == 1024 and entry.facts.architecture == "llama"
    # torch on a CPU holds float32: twice the float16 file.
    assert entry.memory_bytes >= entry.facts.parameters * 4


def test_symlink_loops_end_and_a_model_reachable_twice_is_listed_once(tmp_path, tiny):
    root = tmp_path / "models"
    put_gguf(root / "a" / "m.gguf", template=tiny)
    (root / "a" / "back").symlink_to(root, target_is_directory=True)  # a loop through the root
    (root / "x").mkdir()
    (root / "y").mkdir()
    (root / "x" / "to-y").symlink_to(root / "y", target_is_directory=True)
    (root / "y" / "to-x").symlink_to(root / "x", target_is_directory=True)  # two folders linking each other
    (root / "b").mkdir()
    (root / "b" / "same.gguf").symlink_to(root / "a" / "m.gguf")  # the same file under another name
    (root / "self").symlink_to(root / "self")  # a link to itself
    result = _scan([Location("folder", root), Location("folder", root / "a")], tmp_path)
    assert [e.path for e in result.entries] == [root / "a" / "m.gguf"]
    # The walk itself enters each folder once: every file is met once, whatever the links.
    assert [f.path for f in find_models(root)] == [root / "a" / "m.gguf", root / "b" / "same.gguf"]


def test_a_truncated_or_foreign_gguf_is_listed_with_a_reason_not_an_error(tmp_path, tiny):
    root = tmp_path / "models"
    root.mkdir()
    (root / "cut.gguf").write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 2])
    (root / "foreign.gguf").write_bytes(b"PK\x03\x04 not a model")
    entries = _by_name(_scan([Location("folder", root)], tmp_path))
    assert "truncated" in entries["cut"].problem and entries["cut"].fit == "unknown"
    assert "not a GGUF file" in entries["foreign"].problem


def test_split_models_are_one_entry_and_projectors_are_left_out(tmp_path, tiny):
    root = tmp_path / "models"
    first = put_gguf(root / "big-00001-of-00002.gguf", template=tiny)
    second = put_gguf(root / "big-00002-of-00002.gguf", template=tiny)
    put_gguf(root / "mmproj-big-f16.gguf", template=tiny)
    (entry,) = _scan([Location("folder", root)], tmp_path).entries
    assert entry.name == "big" and entry.path == first
    assert entry.file_bytes == first.stat().st_size + second.stat().st_size


def test_a_second_scan_reuses_header_facts_until_the_file_changes(tmp_path, tiny, monkeypatch):
    import engine.library.discovery as discovery

    root = tmp_path / "models"
    model = put_gguf(root / "m.gguf", template=tiny)
    first = _scan([Location("folder", root)], tmp_path).entries[0]
    reads = []
    real = discovery.gguf_facts
    monkeypatch.setattr(discovery, "gguf_facts", lambda p: reads.append(p) or real(p))
    assert _scan([Location("folder", root)], tmp_path).entries[0].facts == first.facts
    assert reads == []
    put_gguf(model, n_ctx=1024)  # replaced by another model: read again
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))
    again = _scan([Location("folder", root)], tmp_path).entries[0]
    assert len(reads) == 1 and again.facts.context_length == 1024


def test_the_memory_estimate_is_compared_with_the_machine(tmp_path, tiny):
    root = tmp_path / "models"
    put_gguf(root / "m.gguf", template=tiny)
    locations = [Location("folder", root)]
    small = MachineMemory(total_bytes=64 * 2**20, available_bytes=16 * 2**20)
    busy = MachineMemory(total_bytes=8 * 2**30, available_bytes=64 * 2**20)
    assert _scan(locations, tmp_path, machine=small).entries[0].fit == "too big"
    assert _scan(locations, tmp_path, machine=busy).entries[0].fit == "tight"
    assert _scan(locations, tmp_path, machine=BIG_MACHINE).entries[0].fit == "fits"


@pytest.mark.parametrize(
    ("platform", "env", "expected"),
    [
        ("darwin", {}, {"gpt4all": "Library/Application Support/nomic.ai/GPT4All",
                        "llamacpp": "Library/Caches/llama.cpp",
                        "jan": "Library/Application Support/Jan/data/llamacpp/models"}),
        ("win32", {"LOCALAPPDATA": "{home}/AppData/Local", "APPDATA": "{home}/AppData/Roaming"},
         {"gpt4all": "AppData/Local/nomic.ai/GPT4All", "llamacpp": "AppData/Local/llama.cpp",
          "jan": "AppData/Roaming/Jan/data/llamacpp/models"}),
        ("linux", {"XDG_CACHE_HOME": "{home}/xdg-cache"}, {"llamacpp": "xdg-cache/llama.cpp",
                                                            "huggingface": "xdg-cache/huggingface/hub"}),
    ],
)
def test_each_platform_looks_where_the_programs_keep_models(tmp_path, platform, env, expected):
    env = {k: v.format(home=tmp_path) for k, v in env.items()}
    locations = default_locations(home=tmp_path, platform=platform, env=env)
    paths = {}
    for loc in locations:
        paths.setdefault(loc.source, []).append(loc.path)
    for source, relative in expected.items():
        assert tmp_path / relative in paths[source], (source, paths[source])
    assert tmp_path / ".lmstudio" / "models" in paths["lmstudio"]
    assert tmp_path / ".ollama" / "models" in paths["ollama"]


def test_program_variables_move_their_stores(tmp_path):
    env = {"OLLAMA_MODELS": str(tmp_path / "o"), "HF_HUB_CACHE": str(tmp_path / "hf"),
           "LLAMA_CACHE": str(tmp_path / "lc"), "LOGITLAB_MODEL_FOLDERS": os.pathsep.join([str(tmp_path / "u1"), str(tmp_path / "u2")])}
    locations = default_locations(home=tmp_path, platform="linux", env=env)
    assert Location("ollama", tmp_path / "o", "ollama") in locations
    assert Location("huggingface", tmp_path / "hf", "huggingface") in locations
    assert Location("llamacpp", tmp_path / "lc") in locations
    assert [loc.path for loc in locations if loc.source == "folder"] == [tmp_path / "u1", tmp_path / "u2"]


def test_the_memory_estimate_counts_the_context_the_model_would_open_with(tmp_path):
    """A long-context model opens with a context capped to what its KV cache may take here
    (runtime_settings.choose_context); the library's estimate counts that context, not a fixed one."""
    from engine.library.memory import estimate_bytes
    from engine.runtime_settings import choose_context

    root = tmp_path / "models"
    put_gguf(root / "long.gguf", n_ctx=1 << 20, layers=4)  # a file claiming a million-token context
    machine = MachineMemory(total_bytes=8 * 2**30, available_bytes=64 * 2**20)
    entry = _scan([Location("folder", root)], tmp_path, machine=machine).entries[0]
    facts = entry.facts
    opened = choose_context(facts.context_length, None, kv_bytes_per_token=facts.kv_bytes_per_token,
                            available_bytes=machine.available_bytes)
    assert opened.capped and opened.n_ctx < facts.context_length
    assert entry.memory_bytes == estimate_bytes(facts, entry.backend, machine.available_bytes)
    with_opened = estimate_bytes(facts, entry.backend, machine.available_bytes)
    roomier = estimate_bytes(facts, entry.backend, 64 * 2**30)  # more memory available: a longer context opens
    assert roomier > with_opened
    assert roomier - with_opened == pytest.approx(
        (choose_context(facts.context_length, None, kv_bytes_per_token=facts.kv_bytes_per_token,
                        available_bytes=64 * 2**30).kv_bytes - opened.kv_bytes) * 1.05, rel=1e-6)
