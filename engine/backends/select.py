"""Which backend runs a model; always overridable.

Automatic choice, by what the spec names:
- a URL (`http://host:port/v1`) -> remote (an OpenAI-compatible server);
- a `.gguf` file (the default model is one) -> llama.cpp when `llama_cpp` imports,
  else the file is converted once to a folder for torch/MLX (logged, with how to get the fast path);
- otherwise MLX on Apple Silicon, torch elsewhere.
"""

from __future__ import annotations

import importlib.util
import logging
import platform
import sys

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "mlx", "llamacpp", "remote", "mock")


def is_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def mlx_available() -> bool:
    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def offload_refusal(backend: str | None) -> str | None:
    """Why `backend` takes no offload policy, in words; None when it takes one (or is not known yet)."""
    if backend == "mlx":
        return "offload is not for the mlx backend: MLX shares one memory between CPU and GPU"
    if backend == "remote":
        return "offload is not for a server: the server decides where its weights live"
    return None


def device_refusal(backend: str | None) -> str | None:
    """Why `backend` takes no torch device name, in words; None when it does (torch, or not known yet)."""
    if backend in (None, "torch"):
        return None
    how = ('its GPU share is set with --offload, e.g. "weights=100,0"; or pass --backend torch'
           if backend == "llamacpp" else "pass --backend torch to choose a device")
    return f"--device chooses the torch backend's device; this model runs on {backend} ({how})"


def checks_torch_device(backend: str | None) -> bool:
    """Whether a device name given for `backend` is one torch must find usable here before loading."""
    return backend == "torch"


def choose_backend(requested: str | None = None, source_kind: str | None = None) -> str:
    """Resolve "auto" (or None) to a concrete backend name; validate explicit names.

    Args:
        requested: a name from BACKENDS, or None for "auto".
        source_kind: what the model spec resolved to ("default", "folder", "gguf", "hub", "url"),
            when known; it drives the automatic choice and rules out impossible pairs.
    """
    name = (requested or "auto").lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if source_kind == "url" and name not in ("auto", "remote"):
        raise ValueError(f"a server URL is opened by the remote backend, not {name!r}")
    if name == "remote" and source_kind not in (None, "url"):
        raise ValueError("the remote backend needs a server URL such as http://127.0.0.1:8000/v1")
    if name == "llamacpp":
        if not llamacpp_available():
            raise ValueError("the llamacpp backend needs llama-cpp-python: pip install 'logitlab[gguf]'")
        if source_kind not in (None, "default", "gguf"):
            raise ValueError("the llamacpp backend runs .gguf files; this model is not one")
    if name == "mlx" and not mlx_available():
        raise ValueError("the mlx backend needs mlx-lm: pip install 'logitlab[mlx]'")
    if name != "auto":
        return name
    if source_kind == "url":
        return "remote"
    if source_kind in ("default", "gguf"):
        if llamacpp_available():
            return "llamacpp"
        log.info(
            "llama-cpp-python is not installed, so this GGUF file is converted to float32 for %s "
            "(larger and slower); pip install 'logitlab[gguf]' runs it natively",
            "mlx" if is_apple_silicon() and mlx_available() else "torch",
        )
    if is_apple_silicon() and mlx_available():
        return "mlx"
    return "torch"
