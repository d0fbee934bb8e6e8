"""How a model runs on this machine (threads, context, GPU layers, batch size): set when it loads.

Today these are llama.cpp's settings (GGUF files): other backends refuse a
value they would not use, rather than ignore it. Every field is None by
default, which means the engine's choice (see each field). The window keeps
one of these per model and loads with `load_model(spec, **settings.load_kwargs())`;
the CLI builds one from `--threads`, `--threads-batch`, `--n-ctx`,
`--n-gpu-layers` and `--batch-size` (llama.cpp server's names).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS


@dataclass(frozen=True)
class RuntimeSettings:
    """Load-time settings; None: the engine chooses.

    Attributes:
        n_threads: CPU threads while generating, one token at a time. Default: one fewer than the usable
            CPUs, at most the physical cores (engine/backends/llamacpp/threads.py says why).
        n_threads_batch: CPU threads while reading a prompt. Default: n_threads.
        n_ctx: tokens of context to allocate. Default: the model's, lowered when its cache would not fit
            comfortably in free memory.
        n_gpu_layers: layers on the GPU; -1 means all. Default: all on a GPU build (or what `offload` says),
            none on a CPU build.
        n_batch: prompt tokens per model call. Default: 512.
    """

    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_batch: int | None = None

    def __post_init__(self) -> None:
        problems = []
        for name, label, low, high in (
            ("n_threads", "threads", 1, MAX_THREADS),
            ("n_threads_batch", "prompt threads", 1, MAX_THREADS),
            ("n_ctx", "context length", 1, None),
            ("n_gpu_layers", "GPU layers", -1, None),
            ("n_batch", "batch size", 1, None),
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{label} ({name}) must be a whole number, got {value!r}")
            elif value < low or (high is not None and value > high):
                span = f"from {low} to {high}" if high is not None else f"at least {low}"
                extra = " (-1: all layers)" if name == "n_gpu_layers" else ""
                problems.append(f"{label} ({name}) must be {span}{extra}, got {value}")
        if problems:
            raise ValueError("; ".join(problems))

    def load_kwargs(self) -> dict[str, int]:
        """Keyword arguments for `load_model` / `Engine.load`: the settings that were set."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
