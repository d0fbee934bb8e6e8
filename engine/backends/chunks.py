"""Shapes shared by the backends' research runners: left-padded batches, and every position's logits in chunks.

`left_pad` lays out a batch of prompts right-aligned (torch and MLX runners).

Every position's logits of one sequence, in chunks, is what teacher-forced scoring needs.

The Backend protocol returns only the last position's logits, so scoring a
text through it costs one forward per token. The research runners can do
better: run the sequence in chunks of positions on a KV cache carried from
chunk to chunk and keep every position's logits. A chunk's logits are
(positions, V) float32, so the chunk length is chosen from the vocabulary
size to bound that: 256 positions at SmolLM2's 49k vocabulary (48 MiB),
48 at Gemma's 262k.

Each local backend's position runner (engine.capabilities.PositionRunners:
torch, MLX, llama.cpp) has `position_logits(ids, first, chunk)`, a generator
of those chunks, and `sequence_logprobs(ids)`, all of them normalized as one
(T, V) array.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, T) ids and (B, T) 0/1 mask with each row right-aligned."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = r
            mask[i, width - len(r) :] = 1
    return ids, mask
