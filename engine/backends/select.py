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
from typing import TYPE_CHECKING

from engine.errors import EngineError, ModelLoadError
from engine.runtime_settings import RuntimeSettings

if TYPE_CHECKING:
    from engine.backends.base import Backend

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "mlx", "llamacpp", "remote", "mock")


def is_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def mlx_available() -> bool:
    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def torch_available() -> bool:
    """Whether the torch extra is installed (torch and transformers; the default install runs GGUF files without)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))
    except (ImportError, ValueError):  # a package present but broken counts as missing
        return False


class BackendNotInstalledError(ModelLoadError):
    """The backend a model needs is an optional part of the install that is not installed here."""


def require_installed(backend: str, model_name: str) -> None:
    """Raise BackendNotInstalledError, saying what to install, when `backend` cannot run here for want of it."""
    if backend == "torch" and not torch_available():
        raise BackendNotInstalledError(
            f"{model_name} runs on torch (Hugging Face models do), which is not installed: add it with "
            "pip install 'logitlab[torch]' (from a clone: pip install -e '.[torch]'), then open the model again"
        )


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


# The `RuntimeSettings` fields each backend takes (a backend not named takes none). torch takes the CPU threads
# only: it grows its cache as it goes, reads a prompt in one call with the same threads, and places layers with
# `offload` rather than a layer count.
RUNTIME_SETTINGS_TAKEN: dict[str, tuple[str, ...]] = {
    "llamacpp": RuntimeSettings.names(),
    "torch": ("n_threads",),
}


def runtime_refusal(backend: str, settings: list[str]) -> str | None:
    """Why `backend` cannot take these `RuntimeSettings` fields, in words; None when it takes them all."""
    taken = RUNTIME_SETTINGS_TAKEN.get(backend, ())
    refused = [name for name in settings if name not in taken]
    if not refused:
        return None
    takes = f", which takes only {', '.join(taken)}" if taken else ""
    return (
        f"{', '.join(refused)}: threads, context length, GPU layers and batch size are settings of "
        f"llama.cpp models (.gguf files); this model runs on {backend}{takes}, so leave them out"
    )


def weighs_parameters_in_float32(backend: str) -> bool:
    """Whether `backend` holds a model's weights as float32 on the CPU (torch converts GGUF files so)."""
    return backend == "torch"


def opens_spec_directly(backend: str) -> bool:
    """Whether `backend` opens the spec as given (a server URL, a .gguf file) rather than a Hugging Face folder."""
    return backend in ("remote", "llamacpp")


def cheap_tokenizer(spec: str | None, backend: str | None = "auto"):
    """A context manager giving the tokenizer `spec` will load with, without its weights, where that is cheap (a
    .gguf file llama.cpp opens: its vocab-only load); None elsewhere (a torch or MLX folder needs transformers
    imported, a server a connection: then the check waits for the model). Never downloads or converts."""
    from engine.sources import resolve_spec

    try:
        source = resolve_spec(spec)
        name = choose_backend(backend, source.kind)
    except (ValueError, OSError, EngineError):  # the load says what is wrong, in its own words
        return None
    if name != "llamacpp" or source.path is None or not source.path.is_file():
        return None
    from engine.backends.llamacpp.vocab_only import vocabulary_of

    return vocabulary_of(source.path)


def open_direct(backend: str, source, progress, offload, runtime_kwargs: dict) -> Backend:
    """Open a server URL (remote) or a .gguf file (llamacpp): backends that need no Hugging Face folder."""
    if backend == "remote":
        from engine.backends.remote import RemoteBackend

        return RemoteBackend.connect(source.spec, progress=progress)
    from engine.backends.llamacpp import LlamaCppBackend

    if progress:
        progress(f"loading {source.name} (llamacpp)", None)
    assert source.path is not None
    return LlamaCppBackend(source.path, spec=source.spec, display_name=source.name, offload=offload, **runtime_kwargs)


def open_folder(
    backend: str, folder, source, device, dtype, trust_remote_code: bool, offload, runtime_kwargs: dict | None = None
) -> Backend:
    """A torch or MLX backend for a local Hugging Face folder; `runtime_kwargs`: the `RuntimeSettings` fields
    given, already checked against RUNTIME_SETTINGS_TAKEN (torch: n_threads)."""
    if backend == "mlx":
        from engine.backends.mlx.backend import MlxBackend

        if offload is not None:
            raise ValueError("offload is a torch feature; MLX shares one memory between CPU and GPU")
        return MlxBackend(folder, spec=source.spec, display_name=source.name, trust_remote_code=trust_remote_code)
    from engine.backends.torch.backend import TorchBackend

    return TorchBackend(
        folder,
        spec=source.spec,
        display_name=source.name,
        device=device,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        offload=offload,
        **(runtime_kwargs or {}),
    )


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
            raise ValueError(
                "the llamacpp backend needs llama-cpp-python, part of the plain install: pip install logitlab"
            )
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
            "(larger and slower); pip install llama-cpp-python==0.3.36 runs it natively",
            "mlx" if is_apple_silicon() and mlx_available() else "torch",
        )
    if is_apple_silicon() and mlx_available():
        return "mlx"
    return "torch"
