"""The torch backend's OverlappedForward: the forward on a helper thread while the caller's Python works.

torch releases the GIL inside its kernels, so the decode loop's report of token t (on the caller's thread)
runs while the model computes token t+1 (on the helper). One helper thread, always the same one: the
forward's thread-local torch state (a compiled step's CUDA graphs are per thread) is built once and reused.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

R = TypeVar("R")
T = TypeVar("T")


class OverlapPool:
    """Runs `forward` on one helper thread and `work` on the caller's; made lazily, closed with its backend."""

    def __init__(self, name: str = "torch-overlap") -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None

    def run(self, forward: Callable[[], R], work: Callable[[], T]) -> tuple[R, T]:
        """(forward(), work()), both finished when this returns, also when either raised; forward's error wins."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        pending = self._pool.submit(forward)
        try:
            result = work()
        except BaseException:
            wait([pending])
            pending.result()  # forward's exception, if it raised, wins over work's
            raise
        return pending.result(), result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
