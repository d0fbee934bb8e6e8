"""Python's cyclic garbage collector, run on the UI thread only.

CPython runs a collection in whichever thread crosses gc's allocation threshold: in this app often a
model worker, the CPU-load sampler or the blocking pool. Qt objects caught in reference cycles (a closed
window's widgets, lambdas connected to their signals) are then destroyed from that thread. With PySide6
6.12 this deadlocks the app: the background thread, inside `QObject::disconnect`, holds Qt's connection
mutex and waits for the GIL, while the UI thread holds the GIL and waits for that mutex in
`QObject::connect` (seen in this project's tests on Python 3.13, stacks taken with py-spy; no timeout can
end it, as no Python code runs again). Other bindings crash instead ("Timers cannot be stopped from
another thread").

The remedy calibre and pyqtgraph use: turn automatic collection off and collect from a timer on the UI
thread, a generation at a time, when gc's own thresholds say a collection is due. Reference counting
still frees everything that is not in a cycle at once, in any thread.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

# Often enough that cycles never pile up (a collection of the youngest generation takes well under a
# millisecond), rarely enough that an idle app does not wake for it.
CHECK_INTERVAL_MS = 500


def due_generation(counts: tuple[int, int, int], threshold: tuple[int, ...]) -> int | None:
    """The generation CPython would collect now (None: none is due), from `gc.get_count()` and
    `gc.get_threshold()`: the youngest when its allocations pass the first threshold, an older one
    when, in addition, enough collections of the one below it have run."""
    if threshold[0] <= 0 or counts[0] < threshold[0]:
        return None
    generation = 0
    for older in (1, 2):
        if len(threshold) > older and counts[older] >= threshold[older]:
            generation = older
        else:
            break
    return generation


class UiThreadGarbageCollector(QObject):
    """Disables automatic collection while it runs; `stop()` hands collection back to CPython. Made on the
    UI thread, with the QApplication as parent, it lasts as long as the app."""

    def __init__(self, parent: QObject | None = None, interval_ms: int = CHECK_INTERVAL_MS) -> None:
        super().__init__(parent)
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect_if_due)
        self._timer.start(interval_ms)

    def collect_if_due(self) -> int:
        """Collect the generation that is due, here on the UI thread; the number of objects found unreachable."""
        generation = due_generation(gc.get_count(), gc.get_threshold())
        return 0 if generation is None else gc.collect(generation)

    def stop(self) -> None:
        """Stop the timer, collect everything once (on this thread), and let CPython collect again as before."""
        self._timer.stop()
        gc.collect()
        if self._was_enabled:
            gc.enable()
