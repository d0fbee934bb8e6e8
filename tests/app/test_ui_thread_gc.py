"""Cycles are collected on the UI thread, never in the thread that happens to allocate (app/ui_thread_gc.py)."""

from __future__ import annotations

import gc
import threading

from app.ui_thread_gc import UiThreadGarbageCollector, due_generation


class _Cycle:
    """An object kept alive only by a reference cycle; records the thread that collects it."""

    def __init__(self, collected_in: list[str]) -> None:
        self.me = self
        self.collected_in = collected_in

    def __del__(self) -> None:
        self.collected_in.append(threading.current_thread().name)


def _allocate_in_a_thread(n: int) -> list:
    """What a model worker does all the time: allocate gc-tracked objects (here n lists, which it returns)."""
    made: list = []
    t = threading.Thread(target=lambda: made.extend([] for _ in range(n)), name="busy-worker")
    t.start()
    t.join()
    return made


def _enough_to_trigger() -> int:
    return 4 * max(gc.get_threshold()[0], 1)


def test_without_it_python_collects_in_whichever_thread_allocates():
    """The control: this is what the app must not let happen to Qt objects."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.enable()
    try:
        collected_in: list[str] = []
        _Cycle(collected_in)
        _allocate_in_a_thread(_enough_to_trigger())
        assert collected_in == ["busy-worker"]
    finally:
        if not was_enabled:
            gc.disable()


def test_cycles_are_collected_on_the_ui_thread_when_due(qtbot, qapp):
    collector = UiThreadGarbageCollector(interval_ms=50)
    try:
        assert not gc.isenabled()
        gc.collect()
        collected_in: list[str] = []
        _Cycle(collected_in)
        made = _allocate_in_a_thread(_enough_to_trigger())
        assert collected_in == [] and gc.get_count()[0] >= gc.get_threshold()[0]  # due, yet not collected there
        qtbot.waitUntil(lambda: bool(collected_in), timeout=5_000)  # the generation was due: the UI thread's timer took it
        assert collected_in == [threading.main_thread().name]
        del made
    finally:
        collector.stop()
        collector.deleteLater()


def test_stop_collects_what_is_left_and_hands_collection_back(qapp):
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        collector = UiThreadGarbageCollector()
        assert not gc.isenabled()
        collected_in: list[str] = []
        _Cycle(collected_in)
        collector.stop()
        assert collected_in == [threading.main_thread().name] and gc.isenabled()
        collector.deleteLater()
    finally:
        if not was_enabled:
            gc.disable()


def test_due_generation_follows_cpythons_thresholds():
    threshold = (700, 10, 10)
    assert due_generation((699, 9, 9), threshold) is None
    assert due_generation((700, 0, 0), threshold) == 0
    assert due_generation((700, 10, 0), threshold) == 1
    assert due_generation((700, 10, 10), threshold) == 2
    assert due_generation((700, 9, 10), threshold) == 0  # an older generation only after the one below it
    assert due_generation((5000, 10, 10), (0, 10, 10)) is None  # threshold 0: collection switched off
