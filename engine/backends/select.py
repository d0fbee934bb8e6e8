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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from engine.errors import EngineError, ModelLoadError
from engine.runtime_settings import RuntimeSettings

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path

    from engine.backend import Backend
    from engine.backends.llamacpp.tokenizer import LlamaCppTokenizer
    from engine.offload.policy import OffloadPolicy
    from engine.sources import ModelSource, ProgressCallback

log = logging.getLogger(__name__)

AUTO = "auto"  # not a backend: the choice `choose_backend` makes by what the spec names (the docstring above)
AUTO_HELP = ("a server URL on remote, a .gguf file on llamacpp when installed; otherwise MLX on Apple Silicon, "
             "torch elsewhere (CUDA when present)")
# How a backend opens what the user names: "spec" the spec as given (a server URL, a .gguf file), "folder" a local
# Hugging Face folder (a hub id is downloaded, a .gguf converted, into one), "nothing" no model files at all.
Opens = Literal["spec", "folder", "nothing"]


@dataclass(frozen=True)
class BackendRow:
    """One backend, everything the CLI, the window and the loader know about it before it loads.

    Attributes:
        name: its name on the command line (`--backend`), in `load_model` and in the window's pickers.
        description: one line for help texts (the CLI's `--backend`, the model picker's tooltip).
        module: where its class lives (imported only when it opens: torch, mlx and llama_cpp load late).
        opens: what it opens (`Opens`): `load_model` hands a "spec" backend the spec, a "folder" one a folder.
        user_facing: listed in the window's pickers and the CLI's choices (the mock is for tests).
        every_distribution: gives each position's whole next-token distribution (Compare models needs it; a
            server reports only its top N).
        offload_refusal: why it takes no offload policy, in words; None when it takes one.
        takes_device: takes a torch device name (`--device`), which torch must find usable before loading.
        device_instead: what to do instead of `--device` on this backend (unused where it takes one).
        runtime_settings: the `RuntimeSettings` fields it takes (the rest are refused in words).
        float32_weights: holds a model's weights as float32 on the CPU (torch converts GGUF files so).
    """

    name: str
    description: str
    module: str
    opens: Opens
    user_facing: bool = True
    every_distribution: bool = True
    offload_refusal: str | None = None
    takes_device: bool = False
    device_instead: str = "pass --backend torch to choose a device"
    runtime_settings: tuple[str, ...] = ()
    float32_weights: bool = False


# torch takes the CPU threads only: it grows its cache as it goes, reads a prompt in one call with the same
# threads, and places layers with `offload` rather than a layer count.
BACKEND_TABLE: tuple[BackendRow, ...] = (
    BackendRow("torch", "Hugging Face transformers on PyTorch (CUDA, MPS or the CPU; float weights, offload)",
               "engine.backends.torch.backend", "folder", takes_device=True, runtime_settings=("n_threads",),
               float32_weights=True),
    BackendRow("mlx", "MLX on Apple Silicon (mlx-lm)", "engine.backends.mlx.backend", "folder",
               offload_refusal="offload is not for the mlx backend: MLX shares one memory between CPU and GPU"),
    BackendRow("llamacpp", "llama.cpp (llama-cpp-python) running a .gguf file, quantized as it is",
               "engine.backends.llamacpp", "spec", runtime_settings=RuntimeSettings.names(),
               device_instead='its GPU share is set with --offload, e.g. "weights=100,0"; or pass --backend torch'),
    BackendRow("remote", "an OpenAI-compatible server at a URL (http://host:port/v1)", "engine.backends.remote",
               "spec", every_distribution=False,
               offload_refusal="offload is not for a server: the server decides where its weights live"),
    BackendRow("mock", "a scripted model for tests (no files)", "engine.backends.mock", "nothing", user_facing=False),
)
BACKEND_ROWS: Mapping[str, BackendRow] = {row.name: row for row in BACKEND_TABLE}
BACKENDS: tuple[str, ...] = (AUTO, *BACKEND_ROWS)  # every name `load_model` and `--backend` take
# The `RuntimeSettings` fields each backend takes (a backend not named takes none).
RUNTIME_SETTINGS_TAKEN: Mapping[str, tuple[str, ...]] = {
    row.name: row.runtime_settings for row in BACKEND_TABLE if row.runtime_settings
}


def backend_row(name: str | None) -> BackendRow | None:
    """The row of backend `name` (None for "auto", None, or a name no backend has)."""
    return BACKEND_ROWS.get((name or "").lower())


def user_backends(*, every_distribution: bool = False) -> tuple[str, ...]:
    """The names a user picks from, "auto" first; `every_distribution`: only backends that give whole
    distributions (Compare models)."""
    return (AUTO, *(r.name for r in BACKEND_TABLE if r.user_facing and (r.every_distribution or not every_distribution)))


USER_BACKENDS: tuple[str, ...] = user_backends()  # the window's pickers and the CLI's choices


def backend_help(sep: str = "; ", names: Iterable[str] = USER_BACKENDS) -> str:
    """What each of `names` is, in `names`' order ("auto" and each backend a user picks from unless told): one
    line each for the CLI's --help and the window's tooltips."""
    return sep.join(f"{name}: {AUTO_HELP if name == AUTO else BACKEND_ROWS[name].description}" for name in names)


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
    row = backend_row(backend)
    return row.offload_refusal if row is not None else None


def device_refusal(backend: str | None) -> str | None:
    """Why `backend` takes no torch device name, in words; None when it does (torch, or not known yet)."""
    row = backend_row(backend)
    if row is None or row.takes_device:
        return None
    return f"--device chooses the torch backend's device; this model runs on {row.name} ({row.device_instead})"


def checks_torch_device(backend: str | None) -> bool:
    """Whether a device name given for `backend` is one torch must find usable here before loading."""
    row = backend_row(backend)
    return row is not None and row.takes_device


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
    row = backend_row(backend)
    return row is not None and row.float32_weights


def opens_spec_directly(backend: str) -> bool:
    """Whether `backend` opens the spec as given (a server URL, a .gguf file) rather than a Hugging Face folder."""
    row = backend_row(backend)
    return row is not None and row.opens == "spec"


def opens_nothing(backend: str | None) -> bool:
    """Whether `backend` loads no model files (the mock): nothing to resolve or check before it opens."""
    row = backend_row(backend)
    return row is not None and row.opens == "nothing"


def cheap_tokenizer(spec: str | None, backend: str | None = "auto") -> AbstractContextManager[LlamaCppTokenizer] | None:
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


def open_direct(backend: str, source: ModelSource, progress: ProgressCallback | None,
                offload: OffloadPolicy | str | None, runtime_kwargs: dict[str, Any]) -> Backend:
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
    backend: str, folder: Path, source: ModelSource, device: str | None, dtype: str | None, trust_remote_code: bool,
    offload: OffloadPolicy | str | None, runtime_kwargs: dict[str, Any] | None = None,
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
