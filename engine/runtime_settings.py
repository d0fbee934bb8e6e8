"""How a model runs on this machine (threads, context, GPU layers, batch size): set when it loads.

These are llama.cpp's settings (GGUF files); torch takes the threads (on the
CPU). A backend refuses a value it would not use, rather than ignore it
(`engine.backends.select.RUNTIME_SETTINGS_TAKEN`). Every field is None by
default, which means the engine's choice (see each field). The window keeps
one of these per model and loads with `load_model(spec, **settings.load_kwargs())`;
the CLI builds one from `--threads`, `--threads-batch`, `--n-ctx`,
`--n-gpu-layers` and `--batch-size` (llama.cpp server's names).

The default context is the model's own, capped so its KV cache fits a memory
budget (`choose_context`): llama.cpp allocates the whole cache up front, so a
file claiming a 4-billion-token context would take gigabytes before the
first token, and Gemma 3 270M at its full 32k context takes more memory for
its cache than for its weights. A loaded model reports what it runs with in
`ModelInfo.runtime` (`RuntimeFacts`): the values, the cache's size, why the
context was capped, and which settings it cannot take and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS
INT32_MAX = 2**31 - 1  # llama.cpp takes these as C ints: a larger value wraps around and crashes it
# Each setting's range (lowest, highest), checked by RuntimeSettings itself: the one check the window's
# dialog and the CLI share. n_batch: llama.cpp allocates a batch of this many tokens up front (2**31 crashed
# it); 65536 is far beyond what any prompt chunk gains from. n_gpu_layers: more than a model has means all.
RANGES: dict[str, tuple[int, int]] = {
    "n_threads": (1, MAX_THREADS),
    "n_threads_batch": (1, MAX_THREADS),
    "n_ctx": (1, INT32_MAX),
    "n_gpu_layers": (-1, 9999),
    "n_batch": (1, 65536),
}
# The default context's KV cache takes at most the smaller of these. 512 MiB: the default model's
# whole 8k context (23 KB a token: 180 MiB), 16k of Gemma 3 270M's 32k (18 KB a token), 4k for an
# 8B Llama 3 (128 KB a token; LM Studio's default too). A quarter of the available memory: room for
# the weights and everything else on a small machine.
KV_BUDGET_BYTES = 512 << 20
KV_SHARE_OF_AVAILABLE = 0.25
MIN_DEFAULT_CTX = 2048  # a capped context is never smaller than this unless the model's own is
UNSTATED_CTX = 4096  # a file that does not say its context length: llama.cpp's common default
LABELS = {
    "n_ctx": "context length",
    "n_threads": "threads",
    "n_threads_batch": "prompt threads",
    "n_gpu_layers": "GPU layers",
    "n_batch": "batch size",
}
NOT_TAKEN = (
    "this model's runtime chooses it: threads, context length, GPU layers and batch size are settings "
    "of llama.cpp models (.gguf files)"
)


@dataclass(frozen=True)
class RuntimeSettings:
    """Load-time settings; None: the engine chooses.

    Attributes:
        n_threads: CPU threads while generating, one token at a time (llama.cpp, torch on the CPU). Default:
            chosen for each answer from the cores free at its start (engine/cpu_load.py): every physical
            core on an idle machine, fewer beside busy programs.
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
        for name, (low, high) in RANGES.items():
            label = LABELS[name]
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{label} ({name}) must be a whole number, got {value!r}")
            elif not low <= value <= high:
                extra = " (-1: all layers)" if name == "n_gpu_layers" else ""
                problems.append(f"{label} ({name}) must be from {low} to {high:,}{extra}, got {value:,}")
        if problems:
            raise ValueError("; ".join(problems))

    def load_kwargs(self) -> dict[str, int]:
        """Keyword arguments for `load_model` / `Engine.load`: the settings that were set."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @staticmethod
    def range(name: str) -> tuple[int, int]:
        """(lowest, highest) value of a field: what the window's spin boxes and the CLI allow."""
        return RANGES[name]

    @staticmethod
    def label(name: str) -> str:
        """A field as people name it: "context length" for n_ctx."""
        return LABELS[name]

    def describe(self) -> str:
        """The settings that were set, as people name them: "context length 4096, threads 2"; "" when none."""
        return ", ".join(f"{LABELS[k]} {v}" for k, v in self.load_kwargs().items())

    @classmethod
    def from_dict(cls, values: dict) -> "RuntimeSettings":
        """From `load_kwargs()`'s form (a saved setting); unknown keys are left out, bad values raise ValueError."""
        return cls(**{k: v for k, v in values.items() if k in cls.names()})


@dataclass(frozen=True)
class ContextChoice:
    """The context a model is loaded with, and what its KV cache costs."""

    n_ctx: int
    trained: int  # the model's own context length
    kv_bytes_per_token: int  # 0: unknown
    capped: str = ""  # why n_ctx is below `trained` when the engine chose it; "" otherwise

    @property
    def kv_bytes(self) -> int:
        return self.n_ctx * self.kv_bytes_per_token


def kv_budget_bytes(available_bytes: int) -> int:
    """The most memory a default context's KV cache may take, with `available_bytes` of memory available."""
    return min(KV_BUDGET_BYTES, int(available_bytes * KV_SHARE_OF_AVAILABLE))


def choose_context(
    trained: int, requested: int | None, *, kv_bytes_per_token: int, available_bytes: int
) -> ContextChoice:
    """The context to allocate: as asked, else the model's own capped so its KV cache fits the budget.

    The cap halves the model's context until the cache fits `kv_budget_bytes(available_bytes)`
    (powers of two stay powers of two), never below MIN_DEFAULT_CTX (or the model's own, if smaller).

    Args:
        trained: the model's context length (0 or less: the file does not say; UNSTATED_CTX is used).
        requested: the user's context length, or None for the default.
        kv_bytes_per_token: keys and values of one position over all layers (0: unknown, never capped).
        available_bytes: memory available now (engine.offload.auto.free_cpu_bytes).

    Raises:
        ValueError: `requested` is below 1 or above the model's context length, in words.
    """
    if trained <= 0:
        trained = UNSTATED_CTX
    if requested is not None:
        if requested < 1:
            raise ValueError(f"the context length must be at least 1 token, got {requested}")
        if requested > trained:
            raise ValueError(
                f"a context of {requested:,} tokens is longer than the model's own ({trained:,}); choose at most {trained:,}"
            )
        return ContextChoice(requested, trained, kv_bytes_per_token)
    budget = kv_budget_bytes(available_bytes)
    if kv_bytes_per_token <= 0 or trained * kv_bytes_per_token <= budget:
        return ContextChoice(trained, trained, kv_bytes_per_token)
    n = trained
    while n > MIN_DEFAULT_CTX and n * kv_bytes_per_token > budget:
        n //= 2
    n = max(n, min(MIN_DEFAULT_CTX, trained))
    why = (
        f"capped from the model's {trained:,} tokens, whose KV cache would take "
        f"{size_text(trained * kv_bytes_per_token)}, to fit {size_text(budget)} "
        f"(the smaller of {size_text(KV_BUDGET_BYTES)} and a quarter of the {size_text(available_bytes)} available); "
        "set the context length to choose"
    )
    return ContextChoice(n, trained, kv_bytes_per_token, why)


def size_text(nbytes: int) -> str:
    """A memory size as people read it: "512 MiB", "1.5 GiB", "64 KiB"."""
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:,.1f} GiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:,.0f} MiB"
    return f"{nbytes / 2**10:,.0f} KiB"


@dataclass(frozen=True)
class RuntimeFacts:
    """How a loaded model runs here (`ModelInfo.runtime`): for the status bar and the runtime settings dialog.

    The default (no field set) is a model whose runtime takes none of the settings (a torch, MLX
    or server model): `why_not` says so for each.

    Attributes:
        in_use: the values it runs with, the engine's choices filled in (None where it does not say).
        trained_context: the model's own context length (0: unknown).
        kv_cache_bytes: the KV cache allocated for the whole context (0: unknown).
        context_note: why the context is below the model's own when the engine chose it; "".
        takes: the `RuntimeSettings` fields this model can be loaded with.
        reasons: (field, why not) for fields it cannot take, where there is more to say than NOT_TAKEN.
    """

    in_use: RuntimeSettings = field(default_factory=RuntimeSettings)
    trained_context: int = 0
    kv_cache_bytes: int = 0
    context_note: str = ""
    takes: tuple[str, ...] = ()
    reasons: tuple[tuple[str, str], ...] = ()

    def why_not(self, name: str) -> str | None:
        """Why setting `name` cannot be chosen for this model, in words; None when it can."""
        if name in self.takes:
            return None
        return dict(self.reasons).get(name, NOT_TAKEN)

    def summary(self) -> str:
        """One line: "KV cache 288 MiB for 16,384 tokens (model: 32,768)"; "" when nothing is known."""
        n_ctx = self.in_use.n_ctx
        if not self.kv_cache_bytes or not n_ctx:
            return ""
        model = f" (model: {self.trained_context:,})" if self.trained_context and self.trained_context != n_ctx else ""
        return f"KV cache {size_text(self.kv_cache_bytes)} for {n_ctx:,} tokens{model}"
