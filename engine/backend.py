"""The protocol every backend implements, and the prefix-reuse logic they share.

A backend owns one model and one KV cache for a single sequence. It can run
new tokens on top of the cache and return the last position's logits, and it
can trim the cache back to a prefix. Everything else (sampling, stopping,
events) is backend-neutral and lives in `engine.decode`. What only some backends can do is a
capability in engine/capabilities.py beside this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from engine.capabilities import InterruptibleForward
from engine.model_info import ModelInfo
from engine.tokenizer import TokenizerLike

# Tokens per prefill forward on a backend that cannot stop inside one (torch, MLX): bounds activation
# memory, and how long a cancel waits. 256 rather than 512: on the default model on torch (CPU) a
# 1,024-token prompt took 1.0-1.15 s in chunks of 256, 1.3 s in 128s and 2.2-2.3 s in 512s (best of 3);
# on MLX (Linux CPU) the three sizes were within the noise.
PREFILL_CHUNK = 256


@runtime_checkable
class Backend(Protocol):
    name: str
    info: ModelInfo

    @property
    def tokenizer(self) -> TokenizerLike:
        """The model's tokenizer (a server without a tokenize endpoint has one that says so when used)."""
        ...

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


class CachedTokens:
    """The token bookkeeping of a backend's KV cache, written once: `cached_tokens` and `trim_cache`.

    A backend inherits this, appends to `self._tokens` what its `forward` ran,
    and says how its own cache is cut: `_cut_cache(keep)` drops the cached
    positions from `keep` on and returns False when its cache cannot be cut
    there (a recurrent state, a sliding window that moved past it), and
    `_clear_cache()` drops everything. A cut that fails clears the cache, so
    the next prefill recomputes rather than reusing a wrong state.
    """

    _tokens: list[int]

    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose keys/values are in the cache, in order."""
        return self._tokens

    def trim_cache(self, keep: int) -> int:
        """Keep the first `keep` cached tokens; return how many are kept (0 when the cache had to be cleared)."""
        keep = max(0, min(keep, len(self._tokens)))
        if keep == len(self._tokens):
            return keep
        if keep == 0 or not self._cut_cache(keep):
            self._clear_cache()
            self._tokens = []
            return 0
        del self._tokens[keep:]
        return keep

    def _cut_cache(self, keep: int) -> bool:
        """Drop cached positions `keep`.. from the model's cache; False if it cannot be cut there."""
        raise NotImplementedError

    def _clear_cache(self) -> None:
        """Drop the whole cache (`_tokens` is emptied by the caller)."""
        raise NotImplementedError


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_prefix_length(seqs: Sequence[Sequence[int]], minimum: int = 1) -> int:
    """Tokens every one of `seqs` begins with, leaving each at least its last token to run (its logits); 0 when
    that is under `minimum`, or for fewer than two sequences. What a batch computes once and shares."""
    if len(seqs) < 2:
        return 0
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for s in seqs[1:]:
        n = min(n, common_prefix_len(first, s))
    return n if n >= minimum else 0


def prefill(
    backend: Backend,
    prompt: Sequence[int],
    chunk: int | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    schedule: Sequence[tuple[int, int]] | None = None,
) -> tuple[np.ndarray | None, int]:
    """Bring the cache to `prompt` reusing the longest cached prefix; return (last logits, reused count).

    At least the last prompt token is always run, because its logits are what
    the first new token is sampled from. `cancelled` is checked between
    chunks, so a long prompt can be stopped; then the logits are None (the
    chunks already run stay cached and are reused next time). A backend that
    is `InterruptibleForward` also stops inside a chunk, within milliseconds:
    there `cancelled` is polled from another thread, so it must be thread-safe
    (`threading.Event.is_set` is), and the whole prompt is one chunk unless
    `chunk` says otherwise (the backend splits it into its own batches).
    Other backends run `chunk` tokens per forward (default PREFILL_CHUNK).

    `schedule` (an exact replay: the pieces the original's prompt cache was computed in, engine/cache_schedule.py)
    computes the prompt in those very pieces, reusing only the cached pieces that were computed the same way,
    on a backend that records its schedule (`RecordsCacheSchedule`) and when it describes exactly this prompt;
    otherwise it is not used (the answer's own record then says how its cache was computed).
    """
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed")
    if schedule is not None and _follows_schedule(backend, prompt, schedule):
        return _prefill_as_scheduled(backend, prompt, schedule, cancelled)
    reuse = min(common_prefix_len(backend.cached_tokens(), prompt), len(prompt) - 1)
    reused = backend.trim_cache(reuse)
    logits = None
    if chunk is None:
        chunk = len(prompt) if isinstance(backend, InterruptibleForward) else PREFILL_CHUNK
    for start in range(reused, len(prompt), chunk):
        if cancelled():
            return None, reused
        logits = _forward(backend, prompt[start : start + chunk], cancelled)
        if logits is None:
            return None, reused
    return logits, reused


def _forward(backend: Backend, ids: Sequence[int], cancelled: Callable[[], bool]) -> np.ndarray | None:
    """One prefill forward, stopped part way where the backend can (None: cancelled)."""
    if isinstance(backend, InterruptibleForward):
        return backend.forward_until(ids, cancelled)
    return backend.forward(ids)


def _follows_schedule(backend: Backend, prompt: Sequence[int], schedule: Sequence[tuple[int, int]]) -> bool:
    from engine.cache_schedule import covers
    from engine.capabilities import RecordsCacheSchedule

    # The last piece must end with the prompt's last token: its logits are the first draw's.
    return (isinstance(backend, RecordsCacheSchedule) and covers(schedule, len(prompt))
            and schedule[-1][0] == schedule[-1][1])


def _prefill_as_scheduled(
    backend: Backend, prompt: Sequence[int], schedule: Sequence[tuple[int, int]], cancelled: Callable[[], bool]
) -> tuple[np.ndarray | None, int]:
    """`prefill` in `schedule`'s pieces: a piece whose later tokens were cut is computed whole (the cut places
    filled with its last kept token: under the causal mask they change nothing before them) and cut again."""
    from engine.cache_schedule import reusable

    cached = backend.cached_tokens()
    same_tokens = common_prefix_len(cached, prompt)
    wanted = list(schedule)
    keep = reusable(backend.cache_schedule(len(cached)), wanted)  # type: ignore[attr-defined]  # RecordsCacheSchedule: checked
    # Whole pieces only, and at least the last one runs (its logits are what the first token is drawn from).
    at, first_piece = 0, 0
    for computed, kept in wanted[:-1]:
        if at + kept > min(keep, same_tokens):
            break
        at += kept
        first_piece += 1
    reused = backend.trim_cache(at)
    if reused != at:  # the cache could not be cut there: everything from the start
        first_piece, at = 0, 0
    logits = None
    for computed, kept in wanted[first_piece:]:
        if cancelled():
            return None, reused
        ids = list(prompt[at : at + kept])
        logits = _forward(backend, ids + [ids[-1]] * (computed - kept), cancelled)
        if logits is None:
            return None, reused
        at += kept
        if computed > kept:
            backend.trim_cache(at)
    return logits, reused


def process_peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
