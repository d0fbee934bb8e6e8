"""How many bytes of decoder-layer weights are held in memory, with a high-water mark.

Counts what the executor holds for compute: weights resident for good
(GPU tier, and CPU tier when the compute device is the CPU) plus weights
fetched for a layer's turn and not yet released. Host staging copies on the
way to a GPU are not counted. Updated from the decode thread and the
prefetch thread, hence the lock.
"""

from __future__ import annotations

import threading


class Residency:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = 0
        self.peak = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.current += nbytes
            self.peak = max(self.peak, self.current)

    def remove(self, nbytes: int) -> None:
        with self._lock:
            self.current -= nbytes
            if self.current < 0:  # a release without a matching fetch is a bug in the executor
                raise AssertionError(f"residency went negative ({self.current} bytes)")

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.current
