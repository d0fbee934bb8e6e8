"""How many CPU threads a CPU model should use for the next answer: every core that other programs leave free.

On an idle 2-core machine llama.cpp decodes the default model at 128 tok/s on 2 threads and 84 on one (first
token 138 vs 250 ms), but beside one busy program 2 threads collapse to a few tok/s: its threads meet at a
barrier after every graph node and wait there for the one that shares a core (engine/backends/llamacpp/
threads.py has the figures). A fixed count is wrong one way or the other, so the count is chosen for each
answer from what is free at that moment: every physical core when the machine is idle, one fewer for each
core other programs keep busy. llama.cpp's answers look again between decode steps, four times a second, over
that last stretch only (`ThreadsPerAnswer.during`): a burst just before the answer (a client starting up
before it sent the request) is gone from the reading within a quarter second, and a program that starts
mid-answer gets its core back.

"Busy" is measured, not guessed from the load average (which counts this process's own threads, so an
answer just finished would make the machine look busy): the CPU time all programs used, from /proc/stat,
minus this process's own (`os.times`), over the last second or so. A daemon thread takes a sample every
SAMPLE_EVERY_S, so a reading is never older than that and never waits; no dependency (psutil) is needed.
Where /proc/stat does not exist (macOS, Windows), nothing is measured and the count is the static default.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 0.25
WINDOW_S = 1.0  # a reading spans about this long, ending now
# A CPU counts as taken by other programs when they use at least this share of one: a desktop's background
# (a few %) leaves every core to the model, a build or a browser tab spinning takes its core.
TAKEN_SHARE = 0.25


def usable_cpus() -> int:
    """Logical CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def physical_cores() -> int:
    """Physical cores this process may run on: a matmul gains nothing from SMT siblings."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        allowed = []
    if allowed:
        cores = set()
        for cpu in allowed:
            try:
                with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_cpus_list") as f:
                    cores.add(f.read().strip())
            except OSError:
                cores.add(str(cpu))
        return max(1, len(cores))
    if sys.platform == "darwin":
        import subprocess

        try:
            out = subprocess.run(["sysctl", "-n", "hw.perflevel0.physicalcpu"], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip().isdigit():
                return int(out.stdout)  # performance cores: efficiency cores slow a matmul down
        except OSError:
            pass
    return max(1, (os.cpu_count() or 2) // 2)


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one moment: all programs' busy time, and this process's own."""

    at: float  # time.monotonic()
    busy_s: float  # every CPU's non-idle time since boot (/proc/stat), summed
    own_s: float  # this process's user + system time, every thread


def read_sample() -> CpuSample | None:
    """Now's sample; None where /proc/stat cannot be read (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    ticks = [int(v) for v in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    times = os.times()
    return CpuSample(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), times.user + times.system)


def others_busy(earlier: CpuSample, later: CpuSample) -> float:
    """CPUs' worth of work other programs did between two samples (1.0: one core kept busy)."""
    span = later.at - earlier.at
    if span <= 0:
        return 0.0
    others = (later.busy_s - earlier.busy_s) - (later.own_s - earlier.own_s)
    return max(0.0, others / span)


def threads_for(physical: int, logical: int, busy: float) -> int:
    """Threads for a model: the physical cores, less one for each CPU other programs take (`busy` CPUs' worth
    of their work), at least one."""
    taken = math.floor(busy + 1 - TAKEN_SHARE) if busy > 0 else 0
    return max(1, min(physical, logical - taken))


class LoadMonitor:
    """Samples /proc/stat on a daemon thread so `others_busy()` reads the last second at once."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S, window_s: float = WINDOW_S):
        self.every_s = every_s
        self.window_s = window_s
        self._samples: deque[CpuSample] = deque(maxlen=max(2, int(window_s / every_s) + 2))
        self._lock = threading.Lock()
        first = read_sample()
        self.available = first is not None
        if first is not None:
            self._samples.append(first)
            threading.Thread(target=self._run, name="cpu load sampler", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self.every_s)
            sample = read_sample()
            if sample is not None:
                with self._lock:
                    self._samples.append(sample)

    def others_busy(self, window_s: float | None = None) -> float | None:
        """CPUs' worth of other programs' work over about the last `window_s` (default: the monitor's); None when
        it cannot be measured."""
        window_s = self.window_s if window_s is None else window_s
        now = read_sample()
        if now is None:
            return None
        with self._lock:
            samples = list(self._samples)
        if not samples:
            return None
        # The newest sample at least a window old, else the oldest there is (just after start: a shorter window).
        old = [s for s in samples if now.at - s.at >= window_s]
        base = old[-1] if old else samples[0]
        if now.at - base.at < 0.05:  # started a moment ago: too short a span to tell anything
            return None
        return others_busy(base, now)


_monitor: LoadMonitor | None = None
_monitor_lock = threading.Lock()


def monitor() -> LoadMonitor:
    """The process's one LoadMonitor (started on first use)."""
    global _monitor
    with _monitor_lock:
        if _monitor is None:
            _monitor = LoadMonitor()
        return _monitor


def threads_text(n: int) -> str:
    """A thread count as people read it: "1 thread", "2 threads"."""
    return f"{n} thread{'s' * (n != 1)}"


class ThreadsPerAnswer:
    """The thread count for each answer of one CPU model: chosen from the free cores when `now()` is asked.

    `fallback` is the count where nothing can be measured (not Linux).
    """

    def __init__(self, fallback: int, physical: int | None = None, logical: int | None = None):
        self.physical = physical or physical_cores()
        self.logical = logical or usable_cpus()
        self.fallback = fallback
        self.monitor = monitor()
        self.last_busy: float | None = None

    def describe(self) -> str:
        """The count as a person reads it where a model's device is shown: "up to 2 threads, as cores are free"
        (chosen per answer), or the fixed fallback where nothing can be measured."""
        if read_sample() is None:
            return threads_text(self.fallback)
        return f"up to {threads_text(self.physical)}, as cores are free"

    def now(self) -> int:
        """The count for an answer about to start, from the last second's reading."""
        n = self._count(None, "for this answer")
        return self.fallback if n is None else n

    def during(self, window_s: float) -> int | None:
        """The count for the rest of an answer under way, from the last `window_s` only: a burst just before it
        started (a client's own start-up, importing its libraries before it sent the request) has passed, or a
        program that started since then takes a core. None when nothing can be measured: keep the count."""
        return self._count(window_s, "from now on")

    def _count(self, window_s: float | None, what: str) -> int | None:
        busy = self.monitor.others_busy(window_s)
        self.last_busy = busy
        if busy is None:
            return None
        n = threads_for(self.physical, self.logical, busy)
        log.debug("other programs use %.2f CPUs: %d threads %s", busy, n, what)
        return n
