"""app/controllers/off_thread.py: work off the UI thread comes back on the loop (result, progress, errors, cancel), and it is
the app's one way across threads."""

from __future__ import annotations

import ast
import asyncio
import functools
import gc
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.controllers.off_thread import ReleasedOnLoop, TaskState, run_off_thread, to_loop

APP = Path(__file__).resolve().parents[2] / "app"

# Where a way across threads may appear in app/ besides app/controllers/off_thread.py (the one way: `run_off_thread` /
# `start_off_thread` out, `to_loop` back, `close_in_background` for a close that must outlive the loop), and why.
# Anything else hands a worker the loop's objects without `ReleasedOnLoop` (released on the worker: app/ui_thread_gc.py).
HOPS_ALLOWED = {
    "controllers/off_thread.py": "the mechanism itself",
    "controllers/token_stream.py": "FrameHop: a stream of items batched to the frame rate (tokens, served requests)",
    "lifecycle.py": "a POSIX signal handler wakes the loop (no thread involved; the signal-safe call)",
}
EXECUTORS_ALLOWED: dict[str, str] = {}  # off_thread.py submits to its executor itself
THREADS_ALLOWED = {"controllers/off_thread.py": "the mechanism itself (close_in_background's daemon thread)"}


def test_result_and_progress_arrive_on_the_loop_in_order():
    seen: list[tuple[int, bool]] = []

    def work(state: TaskState) -> str:
        assert threading.current_thread() is not threading.main_thread()
        for i in range(50):
            state.report(i)
        return "done"

    async def main() -> str:
        return await run_off_thread(work, on_progress=lambda i: seen.append(
            (i, threading.current_thread() is threading.main_thread())))

    assert asyncio.run(main()) == "done"
    # Every report ran on the loop's thread, in order, before the result came back.
    assert seen == [(i, True) for i in range(50)]


def test_an_exception_of_the_work_is_raised_on_the_loop():
    def work(_state: TaskState) -> None:
        raise ValueError("the file is not a model")

    async def main() -> None:
        await run_off_thread(work)

    with pytest.raises(ValueError, match="not a model"):
        asyncio.run(main())


def test_cancelling_asks_the_work_to_stop_and_drops_its_late_progress():
    started, release = threading.Event(), threading.Event()
    shown: list[int] = []
    stopped_early: list[bool] = []

    def work(state: TaskState) -> int:
        started.set()
        release.wait(5)
        stopped_early.append(state.cancelled)
        state.report(1)  # after the cancel: nobody is watching any more
        return 1

    async def main() -> None:
        task = asyncio.ensure_future(run_off_thread(work, on_progress=shown.append))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        for _ in range(40):
            if stopped_early:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # a report that hopped anyway would run now

    asyncio.run(main())
    assert stopped_early == [True] and shown == []


def test_a_queued_work_cancelled_before_it_starts_never_runs():
    ran: list[str] = []
    gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        async def main() -> None:
            busy = asyncio.ensure_future(run_off_thread(lambda _s: gate.wait(5), executor=pool))
            queued = asyncio.ensure_future(run_off_thread(lambda _s: ran.append("queued"), executor=pool))
            await asyncio.sleep(0.02)
            queued.cancel()
            await asyncio.sleep(0.02)  # the cancel reaches the pool while its one thread is still busy
            gate.set()
            await busy
            await asyncio.sleep(0.05)

        asyncio.run(main())
    assert ran == []


def test_to_loop_runs_a_foreign_threads_calls_on_the_loop_and_drops_them_once_it_is_closed():
    calls: list[tuple[int, bool]] = []

    async def main() -> asyncio.AbstractEventLoop:
        hop = to_loop(lambda i: calls.append((i, threading.current_thread() is threading.main_thread())))
        thread = threading.Thread(target=lambda: [hop(i) for i in range(5)])
        thread.start()
        thread.join()
        await asyncio.sleep(0.02)
        return asyncio.get_running_loop()

    loop = asyncio.run(main())
    assert calls == [(i, True) for i in range(5)]
    late = to_loop(calls.append, loop)
    late(99)  # the loop is closed: dropped, not raised into the caller's thread
    assert calls[-1] == (4, True)


class _Widgetlike:
    """Stands for a dialog whose method a worker was handed: records the thread its last reference ended on."""

    def __init__(self, ended_on: list[str]) -> None:
        self.ended_on = ended_on

    def show_progress(self, *_args: object) -> None:
        pass

    def __del__(self) -> None:
        self.ended_on.append(threading.current_thread().name)


def _cancelled_while_running(submit_work) -> list[str]:
    """Work that holds a dialog's method, still running when the dialog's task is cancelled (it closed): the
    names of the threads the dialog's last reference ended on."""
    ended_on: list[str] = []
    started, release = threading.Event(), threading.Event()

    def work(_state: TaskState, on_done) -> None:
        started.set()
        release.wait(5)

    with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
        async def main() -> None:
            dialog = _Widgetlike(ended_on)
            task = asyncio.ensure_future(submit_work(functools.partial(work, on_done=dialog.show_progress), pool))
            del dialog  # the task and the worker hold it now
            while not started.is_set():
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            del task
            # The cancelled task's exception keeps its frames (and the work) in a reference cycle: collected here,
            # so that what still holds the dialog is the worker's side alone, whenever the collector would run.
            gc.collect()
            release.set()
            for _ in range(100):
                if ended_on:
                    break
                await asyncio.sleep(0.01)

        asyncio.run(main())
    return ended_on


def test_a_cancelled_works_references_end_on_the_loop_not_on_the_worker():
    # Control: handed to the pool as it is, the work's last reference, and with it the dialog's, ends on the
    # worker thread (where a Qt object's destruction can deadlock PySide6 against the UI thread).
    async def plain(work, pool):
        loop = asyncio.get_running_loop()
        await asyncio.wrap_future(pool.submit(work, TaskState(loop, None)), loop=loop)

    # Each run's gc.collect() would walk the whole heap: ~0.5 s in a worker that has loaded torch and Qt (13 s of
    # the 26 runs). Frozen, the objects from before this test are skipped; what each run's collection must find
    # (the cancelled task's cycle) is made after the freeze, so it is still collected.
    gc.freeze()
    try:
        assert _cancelled_while_running(plain) == ["worker_0"]
        # run_off_thread: on the loop's thread, every time. Which thread lets go last is a race (a version that
        # handed the loop a reference while the worker kept one ended on the worker in about one run of five), so
        # it is run many times: 25 runs miss a one-in-five failure with probability 0.8**25 < 0.4%.
        ended = [_cancelled_while_running(lambda work, pool: run_off_thread(work, executor=pool)) for _ in range(25)]
    finally:
        gc.unfreeze()
    assert ended == [[threading.main_thread().name]] * 25


def test_released_on_loop_runs_the_work_and_lets_go_of_it_on_the_loop():
    ended_on: list[str] = []
    with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
        async def main() -> int:
            loop = asyncio.get_running_loop()
            held = _Widgetlike(ended_on)
            future = loop.run_in_executor(pool, ReleasedOnLoop(loop, lambda x: 40 + x + (held is not None), 1))
            del held
            result = await future
            del future
            for _ in range(100):
                if ended_on:
                    break
                await asyncio.sleep(0.01)
            return result

        assert asyncio.run(main()) == 42
    assert ended_on == [threading.main_thread().name]
    # Released before it ran (cancelled while queued): it refuses to run rather than run half-held.
    loop = asyncio.new_event_loop()
    work = ReleasedOnLoop(loop, lambda: 1)
    work.release()
    with pytest.raises(RuntimeError, match="released"):
        work()
    # With the loop closed (the app ending), the work's result still comes back; its references end here.
    loop.close()
    assert ReleasedOnLoop(loop, lambda x: x * 7, 6)() == 42


def _calls_to(attr: str, path: Path, owner: str | None = None) -> list[int]:
    """Lines of `path` that call a method named `attr` on anything (on the name `owner` only, when given), or
    call `attr` by its bare name (imported: `from threading import Thread`)."""
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == attr and (
                owner is None or isinstance(func.value, ast.Name) and func.value.id == owner):
            lines.append(node.lineno)
        elif isinstance(func, ast.Name) and func.id == attr:
            lines.append(node.lineno)
    return sorted(lines)


def _found(attr: str, owner: str | None = None) -> dict[str, list[int]]:
    files = sorted(APP.rglob("*.py"))
    assert len(files) > 10
    return {str(p.relative_to(APP)): lines for p in files if (lines := _calls_to(attr, p, owner))}


def test_the_check_sees_each_way_across_threads_where_there_is_one(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import asyncio, threading\nfrom threading import Thread\n"
                      "loop = asyncio.get_event_loop()\nloop.call_soon_threadsafe(print)\n"
                      "loop.run_in_executor(None, print)\nthreading.Thread(target=print).start()\n"
                      "Thread(target=print)\nthreading.Event()\n")
    assert _calls_to("call_soon_threadsafe", sample) == [4]
    assert _calls_to("run_in_executor", sample) == [5]
    assert _calls_to("Thread", sample, "threading") == [6, 7]


@pytest.mark.parametrize("attr, owner, allowed", [
    ("call_soon_threadsafe", None, HOPS_ALLOWED),
    ("run_in_executor", None, EXECUTORS_ALLOWED),
    ("Thread", "threading", THREADS_ALLOWED),
])
def test_only_the_off_thread_module_and_the_listed_exceptions_cross_threads(attr, owner, allowed):
    found = _found(attr, owner)  # (the check sees a call where there is one: the test above)
    unexpected = {path: lines for path, lines in found.items() if path not in allowed}
    assert not unexpected, (f"{attr} outside app/controllers/off_thread.py: {unexpected}; use run_off_thread, start_off_thread, "
                            "to_loop or close_in_background (or add the file to the list with the reason)")
    assert set(allowed) <= set(found), f"listed but not needed any more: {set(allowed) - set(found)}"
