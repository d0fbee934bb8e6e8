"""`load_model`: spec in, ready backend out (the model files come from engine.sources)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from engine.backend import Backend
from engine.backends.select import (
    choose_backend,
    open_direct,
    open_folder,
    opens_spec_directly,
    require_installed,
    runtime_refusal,
)
from engine.runtime_settings import RuntimeSettings
from engine.sources import ProgressCallback, materialize, resolve_spec
from engine.sources.hub import revision_of
from engine.sources.remote_code import is_remote_code_error, refusal, refuse_unless_trusted

if TYPE_CHECKING:
    from engine.offload.policy import OffloadPolicy

log = logging.getLogger(__name__)


def load_model(
    spec: str | None = None,
    *,
    backend: str | None = "auto",
    device: str | None = None,
    dtype: str | None = None,
    progress: ProgressCallback | None = None,
    trust_remote_code: bool = False,
    offload: OffloadPolicy | str | None = None,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_threads_batch: int | None = None,
    n_gpu_layers: int | None = None,
    n_batch: int | None = None,
) -> Backend:
    """Load a model for generation on the calling thread.

    Args:
        spec: None (the default model), a local Hugging Face folder, a `.gguf`
            file (converted once into the user cache) or a hub id `org/name`.
        backend: "auto" (a URL -> remote, a .gguf -> llamacpp when installed, else MLX on
            Apple Silicon, else torch), "torch", "mlx", "llamacpp", "remote" or "mock".
        device: torch device ("cuda", "cpu", ...); None picks CUDA when present.
        dtype: "float32", "bfloat16" or "float16"; None picks per device.
        progress: called with (message, fraction or None) while converting/downloading/loading.
        trust_remote_code: allow model code from the model folder (off unless asked).
        offload: torch only: an `engine.offload.OffloadPolicy`, its CLI form
            "weights=GPU%,CPU% cache=GPU%", or "auto"; None keeps every weight resident.
            llamacpp: the weights' GPU share becomes a share of the layers on the GPU.
        n_ctx, n_threads, n_threads_batch, n_gpu_layers, n_batch: how the model runs here, as
            `engine.runtime_settings.RuntimeSettings` describes them (None: the engine chooses); llama.cpp's
            settings, of which torch takes n_threads (its CPU threads); a backend refuses in words what it
            does not take (`engine.backends.select.RUNTIME_SETTINGS_TAKEN`). A window keeping a
            `RuntimeSettings` passes `**settings.load_kwargs()`.

    Raises:
        ModelNotFoundError, ModelLoadError, HubUnreachableError: with a message for the user.
    """
    if (backend or "").lower() == "mock":
        from engine.backends.mock import MockBackend

        return MockBackend()
    runtime = RuntimeSettings(
        n_threads=n_threads, n_threads_batch=n_threads_batch, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, n_batch=n_batch
    )  # checked before anything loads
    source = resolve_spec(spec)
    name = choose_backend(backend, source.kind)
    if (why := runtime_refusal(name, list(runtime.load_kwargs()))) is not None:
        raise ValueError(why)
    require_installed(name, source.name)  # before a download or conversion that would need it
    if opens_spec_directly(name):
        return open_direct(name, source, progress, offload, runtime.load_kwargs())
    folder = materialize(source, progress)
    refuse_unless_trusted(folder, trust_remote_code)  # in our words, before transformers asks in its own
    if progress:
        progress(f"loading {source.name} ({name})", None)
    try:
        loaded = open_folder(name, folder, source, device, dtype, trust_remote_code, offload, runtime.load_kwargs())
    except ValueError as e:
        if is_remote_code_error(e) and not trust_remote_code:
            raise refusal(folder) from e
        raise
    if source.kind == "hub" and (revision := revision_of(folder)):
        loaded.info = replace(loaded.info, revision=revision)  # which weights, exactly: saved with each answer
    return loaded

