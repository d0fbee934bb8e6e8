"""Background work that steps aside while the foreground runs a model step.

torch.compile builds the compiled decode step in a background thread, and
its tracing is Python: while it runs, every GIL hand-over costs the decode
loop up to the interpreter's switch interval, so a chat turn's first token
took 6-10x longer on a GPU while the step compiled (issue 31). Here the
foreground marks each model step (`foreground_step()`), and a background
thread running inside `yielding_to_foreground()` stops at its next Python
call or return while a step ran less than `HOLD_S` ago, sleeping (without
the GIL) until the foreground has been quiet that long. The background
thread also runs at the lowest CPU priority where the OS lets one thread
have its own (Linux), which the compiler's worker processes inherit.

The price is the build's: a profile hook runs at every call and return of
the thread, which made dynamo's tracing of a 2-layer Llama 1.6x slower on
the CPU here (6.4 s -> 9.8 s); compilation is background work, answers are not.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)

HOLD_S = 0.5  # seconds after a foreground step during which background work stays paused (spans a turn's steps)
_PAUSE_SLICE_S = 0.02


class ForegroundGate:
    """When the foreground last ran a step, and a way for background work to wait until it has been quiet."""

    def __init__(self, hold_s: float = HOLD_S):
        self.hold_s = hold_s
        self._quiet_from = 0.0  # time.monotonic() from which background work may run

    def touch(self) -> None:
        """The foreground runs a step now: background work pauses for the next `hold_s` seconds."""
        self._quiet_from = time.monotonic() + self.hold_s

    def busy(self) -> bool:
        return time.monotonic() < self._quiet_from

    def wait_quiet(self) -> float:
        """Sleep (releasing the GIL) until the foreground has been quiet for `hold_s`; the seconds waited."""
        start = now = time.monotonic()
        while now < self._quiet_from:
            time.sleep(min(self._quiet_from - now, _PAUSE_SLICE_S))
            now = time.monotonic()
        return now - start


GATE = ForegroundGate()


def foreground_step() -> None:
    """Called by the backends at each model step of an answer (cheap: one clock read)."""
    GATE.touch()


def _lower_thread_priority() -> None:
    if sys.platform != "linux":  # elsewhere setpriority would renice the whole process
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError as e:
        log.debug("could not lower the background thread's priority: %s", e)


@contextmanager
def yielding_to_foreground(gate: ForegroundGate = GATE) -> Iterator[None]:
    """Inside, this thread pauses at every Python call/return while `gate` is busy; at the lowest priority."""
    _lower_thread_priority()

    # A profile hook: this thread only, call/return events only.
    def pause_while_busy(frame: FrameType, event: str, arg: object) -> None:
        if time.monotonic() < gate._quiet_from:
            gate.wait_quiet()

    gate.wait_quiet()  # start only once the foreground is quiet
    previous = sys.getprofile()
    sys.setprofile(pause_while_busy)
    try:
        yield
    finally:
        sys.setprofile(previous)
