"""The protocol every backend implements, and the prefix-reuse logic they share.

A backend owns one model and one KV cache for a single sequence. It can run
new tokens on top of the cache and return the last position's logits, and it
can trim the cache back to a prefix. Everything else (sampling, stopping,
events) is backend-neutral and lives in `engine.decode`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from engine.model_info import ModelInfo
from engine.tokenizer import Tokenizer

PREFILL_CHUNK = 512  # tokens per prefill forward: bounds activation memory on long prompts


@runtime_checkable
class Backend(Protocol):
    name: str
    info: ModelInfo
    tokenizer: Tokenizer

    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose keys/values are in the cache, in order."""
        ...

    def trim_cache(self, keep: int) -> int:
        """Keep the first `keep` cached tokens; return how many are kept (0 if the cache cannot be trimmed)."""
        ...

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        """Run `token_ids` after the cached ones, extend the cache, return the last logits, float32 (V,)."""
        ...

    def peak_memory_bytes(self) -> int: ...

    def close(self) -> None: ...


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefill(
    backend: Backend,
    prompt: Sequence[int],
    chunk: int = PREFILL_CHUNK,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[np.ndarray | None, int]:
    """Bring the cache to `prompt` reusing the longest cached prefix; return (last logits, reused count).

    At least the last prompt token is always run, because its logits are what
    the first new token is sampled from. `cancelled` is checked between
    chunks, so a long prompt can be stopped; then the logits are None (the
    chunks already run stay cached and are reused next time).
    """
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed")
    reuse = min(common_prefix_len(backend.cached_tokens(), prompt), len(prompt) - 1)
    reused = backend.trim_cache(reuse)
    logits = None
    for start in range(reused, len(prompt), chunk):
        if cancelled():
            return None, reused
        logits = backend.forward(prompt[start : start + chunk])
    return logits, reused


def process_peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
