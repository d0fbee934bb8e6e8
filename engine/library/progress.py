"""Download progress as the user sees it (bytes, speed, time left) and a cancel switch for a worker thread."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.library.errors import DownloadCancelled

SPEED_WINDOW_S = 5.0  # speed is averaged over the last few seconds: steady, yet quick to follow a change


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


@dataclass(frozen=True)
class DownloadProgress:
    what: str  # the file (or repository) being downloaded
    done_bytes: int
    total_bytes: int | None  # None while the server has not said
    bytes_per_s: float

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.done_bytes / self.total_bytes) if self.total_bytes else None

    @property
    def seconds_left(self) -> float | None:
        if not self.total_bytes or self.bytes_per_s <= 0:
            return None
        return max(0.0, (self.total_bytes - self.done_bytes) / self.bytes_per_s)

    def describe(self) -> str:
        """"12.3 MB of 98.4 MB, 4.5 MB/s, 19 s left"."""
        size = format_bytes(self.done_bytes)
        if self.total_bytes:
            size += f" of {format_bytes(self.total_bytes)}"
        parts = [size]
        if self.bytes_per_s > 0:
            parts.append(f"{format_bytes(self.bytes_per_s)}/s")
        if (left := self.seconds_left) is not None:
            parts.append(f"{format_duration(left)} left")
        return ", ".join(parts)


ProgressFn = Callable[[DownloadProgress], None]


class RateMeter:
    """Bytes per second over the last SPEED_WINDOW_S; one per download (created by the download, not kept)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, done_bytes: int) -> float:
        now = self._clock()
        self._samples.append((now, done_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW_S:
            self._samples.popleft()
        t0, b0 = self._samples[0]
        return (done_bytes - b0) / (now - t0) if now > t0 else 0.0


class CancelToken:
    """Set from any thread (a Cancel button, Ctrl-C); the download checks it between chunks."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self, what: str) -> None:
        if self._event.is_set():
            raise DownloadCancelled(f"the download of {what} was cancelled; the part received is kept, so pulling it again resumes")
