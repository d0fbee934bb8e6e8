"""Every position's logits of one sequence, in chunks: what teacher-forced scoring needs.

The Backend protocol returns only the last position's logits, so scoring a
text through it costs one forward per token. The research runners can do
better: run the sequence in chunks of positions on a KV cache carried from
chunk to chunk and keep every position's logits. A chunk's logits are
(positions, V) float32, so the chunk length is chosen from the vocabulary
size to bound that: 256 positions at SmolLM2's 49k vocabulary (48 MiB),
48 at Gemma's 262k.

Each local runner (`TorchRunner`, `MlxRunner`, `LlamaCppRunner`) has
`position_logits(ids, first, chunk)`, a generator of those chunks, and
`sequence_logprobs(ids)`, all of them normalized as one (T, V) array.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

LOGITS_BUDGET = 256 * 49_152  # float32 logits held per chunk: 48 MiB
MIN_CHUNK, MAX_CHUNK = 16, 256  # positions per forward


def positions_per_chunk(vocab_size: int) -> int:
    """Positions per forward when every position's logits are kept: 256 at a 49k vocabulary, 48 at 262k."""
    if vocab_size <= 0:
        return MAX_CHUNK
    return max(MIN_CHUNK, min(MAX_CHUNK, LOGITS_BUDGET // vocab_size))


def chunk_spans(n: int, chunk: int, first: int) -> Iterable[tuple[int, int, int]]:
    """(lo, hi, keep) per forward over positions [0, n): `keep` = how many of the chunk's last positions
    are at or after `first` (their logits are wanted; earlier positions only fill the KV cache)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 position, got {chunk}")
    if not 0 <= first < n:
        raise ValueError(f"first must be in [0, {n}), got {first}")
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        yield lo, hi, max(0, hi - max(lo, first))


def stack_logprobs(chunks: Iterable[np.ndarray]) -> np.ndarray:
    """(T, V) float32 log-softmax of the concatenated (n, V) logit chunks."""
    rows = np.concatenate(list(chunks)).astype(np.float32, copy=False)
    m = rows.max(axis=-1, keepdims=True)
    return (rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))).astype(np.float32)


def sequence_runner_for(backend: Any, n_tokens: int) -> Any | None:
    """A runner with `position_logits` for one sequence of up to `n_tokens` on `backend`, or None.

    None for backends whose runner cannot give every position's logits: `remote`
    (a server's top-N per generated token only) and `mock`. The runner shares
    the backend's weights but not its KV cache, so the backend's cached
    conversation is left as it was; call it on the backend's worker thread and
    `close()` it (when it has `close`) before the backend closes.
    """
    if backend.name == "torch":
        from engine.research.runners import TorchRunner

        new_cache = None
        handle = getattr(backend, "offload", None)
        if handle is not None:  # the KV cache goes where the offload policy puts the backend's own
            from engine.offload import make_kv_cache

            def new_cache():
                return make_kv_cache(backend.model.config, handle.policy, backend.device)

        return TorchRunner(backend.model, new_cache=new_cache)
    if backend.name == "mlx":
        from engine.research.runners import MlxRunner

        return MlxRunner(backend.model)
    if backend.name == "llamacpp":
        from engine.research.llamacpp_runner import LlamaCppRunner

        chunk = positions_per_chunk(backend.n_vocab)
        # One sequence, a cache of just this text, room for one chunk of logits rows.
        return LlamaCppRunner(backend, max_seqs=1, n_batch=chunk, n_ctx=max(n_tokens, chunk), n_outputs=chunk)
    return None
