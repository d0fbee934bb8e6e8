"""huggingface_hub's progress bars turned into our DownloadProgress reports, and our cancel into its stop.

huggingface_hub reports a file's bytes through the `tqdm_class` it is given.
Our subclass draws nothing (it writes to a sink); the tracker adds the
current file's bytes to those of the files already done, so several files
make one bar. It checks free space now and then, and raises
DownloadCancelled from `update` when the user cancels, which stops the
download between chunks (huggingface_hub keeps the `.incomplete` blob and
resumes it next time).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from engine.library.disk import RESERVE_BYTES, FreeSpaceFn, check_space
from engine.library.progress import CancelToken, DownloadProgress, ProgressFn, RateMeter

SPACE_CHECK_EVERY = 64 * 2**20
REPORT_EVERY_S = 0.1


class _Sink:
    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class ProgressTracker:
    """One download's progress over its files (made per call; never shared between downloads)."""

    def __init__(self, what: str, total_bytes: int, progress: ProgressFn | None, cancel: CancelToken,
                 folder: Path, free_space: FreeSpaceFn, reserve: int = RESERVE_BYTES):
        self.what, self.total = what, total_bytes or None
        self._progress, self._cancel = progress, cancel
        self._folder, self._free_space, self._reserve = folder, free_space, reserve
        self._lock = threading.Lock()
        self._meter = RateMeter()
        self._finished = 0  # bytes of files done
        self._reported = 0.0
        self._checked = 0
        self.tqdm_class = self._make_class()

    def file_done(self, size: int) -> None:
        with self._lock:
            self._finished += size
        self._report(0, force=True)

    def _report(self, current: int, force: bool = False) -> None:
        with self._lock:
            done = self._finished + current
            if done - self._checked >= SPACE_CHECK_EVERY:
                self._checked = done
                check_space(self._folder, max(0, (self.total or 0) - done), self._free_space, self._reserve, self.what)
            now = time.monotonic()
            if self._progress and (force or now - self._reported >= REPORT_EVERY_S):
                self._reported = now
                self._progress(DownloadProgress(self.what, done, self.total, self._meter.add(done)))

    def _make_class(self) -> type[tqdm]:
        tracker = self

        class Reporting(tqdm):
            def __init__(self, *args: Any, **kwargs: Any) -> None:  # tqdm's own arguments
                kwargs.pop("name", None)
                kwargs["file"] = _Sink()
                kwargs["disable"] = False
                super().__init__(*args, **kwargs)

            def update(self, n: float | None = 1) -> bool | None:
                tracker._cancel.check(tracker.what)
                out = super().update(n)
                if self.unit == "B":
                    tracker._report(int(self.n))
                return out

        return Reporting
