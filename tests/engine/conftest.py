"""Fixtures for the engine tests: a tiny random-weight GGUF, the default model on llama.cpp, the CPU attention kernel."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """A 2-layer random-weight Llama written as GGUF by `gguf` (byte-level vocabulary): see tests/tiny_gguf.py."""
    from tiny_gguf import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="session", autouse=True)
def llama_class_loads_like_our_backend():
    """Reference runs through llama-cpp-python's own `Llama` load models with our backend's defaults, which
    leave out the AMX weight buffers whose matmul crashes (see engine.backends.llamacpp.native.model_params)."""
    try:
        from engine.backends.llamacpp import native
    except ImportError:  # no llama-cpp-python: its tests skip
        return
    native.use_safe_defaults_for_llama_class()


@pytest.fixture
def serve():
    """Start scripted servers on 127.0.0.1 (tests/remote_server.py FakeServer) for a test; closed after it."""
    from remote_server import FakeServer

    servers: list[FakeServer] = []

    def start(handler) -> FakeServer:
        servers.append(FakeServer(handler))
        return servers[-1]

    yield start
    for s in servers:
        s.close()
