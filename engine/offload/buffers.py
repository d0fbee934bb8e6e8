"""Reused CPU buffers for streamed weights, so the disk tier does not allocate and free a layer per turn.

A fresh large tensor is fresh pages: the kernel zero-fills them on first
touch and unmaps them on free, per layer per token. Layers of one model
come in a handful of shapes, so released buffers are kept by (shape, dtype)
and handed to the next fetch. Since a buffer comes back only when its layer
is released, the pool never holds more than the executor's in-use peak
(two layers when streaming everything). Taken by the prefetch thread, given
back by the decode thread: hence the lock.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch

Key = tuple[tuple[int, ...], torch.dtype]


class BufferPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[Key, list[torch.Tensor]] = defaultdict(list)
        self.allocated_bytes = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        with self._lock:
            free = self._free[(tuple(shape), dtype)]
            if free:
                return free.pop()
            self.allocated_bytes += torch.Size(shape).numel() * dtype.itemsize
        # A normal tensor even when the first fetch runs inside the decode thread's inference_mode: an
        # inference tensor could not be written again by the prefetch thread, which runs outside it.
        with torch.inference_mode(False):
            return torch.empty(shape, dtype=dtype)

    def give(self, t: torch.Tensor) -> None:
        with self._lock:
            self._free[(tuple(t.shape), t.dtype)].append(t)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self.allocated_bytes = 0
