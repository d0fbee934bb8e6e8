"""`load_model`: spec in, ready backend out (the model files come from engine.sources)."""

from __future__ import annotations

import logging
from dataclasses import replace

from engine.backends.base import Backend
from engine.backends.select import choose_backend
from engine.runtime_settings import RuntimeSettings
from engine.sources import ProgressCallback, materialize, resolve_spec
from engine.sources.hub import revision_of
from engine.sources.remote_code import is_remote_code_error, refusal, refuse_unless_trusted

log = logging.getLogger(__name__)


def load_model(
    spec: str | None = None,
    *,
    backend: str | None = "auto",
    device: str | None = None,
    dtype: str | None = None,
    progress: ProgressCallback | None = None,
    trust_remote_code: bool = False,
    offload=None,
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
            `engine.runtime_settings.RuntimeSettings` describes them (None: the engine chooses); today
            llama.cpp's settings, so another backend refuses them in words. A window keeping a
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
    if name != "llamacpp" and runtime.load_kwargs():
        raise ValueError(
            f"{', '.join(runtime.load_kwargs())}: threads, context length, GPU layers and batch size are "
            f"settings of llama.cpp models (.gguf files); this model runs on {name}, so leave them out"
        )
    if name == "remote":
        from engine.backends.remote import RemoteBackend

        return RemoteBackend.connect(source.spec, progress=progress)
    if name == "llamacpp":
        from engine.backends.llamacpp import LlamaCppBackend

        if progress:
            progress(f"loading {source.name} (llamacpp)", None)
        assert source.path is not None
        return LlamaCppBackend(
            source.path, spec=source.spec, display_name=source.name, offload=offload, **runtime.load_kwargs()
        )
    folder = materialize(source, progress)
    refuse_unless_trusted(folder, trust_remote_code)  # in our words, before transformers asks in its own
    if progress:
        progress(f"loading {source.name} ({name})", None)
    try:
        loaded = _load_folder(name, folder, source, device, dtype, trust_remote_code, offload)
    except ValueError as e:
        if is_remote_code_error(e) and not trust_remote_code:
            raise refusal(folder) from e
        raise
    if source.kind == "hub" and (revision := revision_of(folder)):
        loaded.info = replace(loaded.info, revision=revision)  # which weights, exactly: saved with each answer
    return loaded


def _load_folder(name: str, folder, source, device, dtype, trust_remote_code: bool, offload) -> Backend:
    """A torch or MLX backend for a local Hugging Face folder."""
    if name == "mlx":
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
    )
