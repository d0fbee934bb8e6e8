"""app/controllers/off_thread.py is the one way off the UI thread and back: what the loop hands a worker ends on the loop,
whichever way it went (a hop a foreign thread holds, a job a callback waits for), and a close that must outlive
the loop runs on a daemon thread. (The rule that nothing in app/ goes another way: tests/app/test_off_thread.py.)"""

from __future__ import annotations

import ast
import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from app.controllers import off_thread


class _Widgetlike:
    """Stands for a widget whose method a thread was handed: records the thread its last reference ended on."""

    def __init__(self, ended_on: list[str]) -> None:
        self.ended_on = ended_on
        self.called = threading.Event()

    def show(self, *_args: object) -> None:
        self.called.set()

    def __del__(self) -> None:
        self.ended_on.append(threading.current_thread().name)


async def _until(ended_on: list[str]) -> None:
    for _ in range(200):
        if ended_on:
            return
        await asyncio.sleep(0.01)


def test_a_hop_that_a_foreign_thread_drops_lets_go_of_its_function_on_the_loop():
    # The model's worker holds a `to_loop` hop (a Signal's emit, a controller's method) for a whole generation and
    # drops it when it ends: the function's last reference must end on the loop, not on that thread.
    ended_on: list[str] = []

    async def main() -> None:
        widget = _Widgetlike(ended_on)
        called = widget.called
        held = [off_thread.to_loop(widget.show)]
        del widget

        def foreign() -> None:
            held[0]("a step")
            called.wait(5)  # the call ran on the loop and the loop let go of its handle: only the hop holds it now
            threading.Event().wait(0.05)
            held.clear()  # the last reference to the hop, dropped on this thread

        thread = threading.Thread(target=foreign, name="foreign")
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.005)
        await _until(ended_on)

    asyncio.run(main())
    assert ended_on == [threading.main_thread().name]


def test_start_off_thread_calls_back_on_the_loop_and_lets_go_of_the_job_there():
    ended_on: list[str] = []
    done: list[tuple[object, object, bool]] = []

    with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
        async def main() -> None:
            widget = _Widgetlike(ended_on)
            assert off_thread.start_off_thread(lambda: (widget is not None) and threading.current_thread().name,
                                               lambda result, error: done.append(
                                                   (result, error, threading.current_thread() is threading.main_thread())),
                                               executor=pool)
            del widget
            await _until(ended_on)
            while not done:
                await asyncio.sleep(0.005)

            def fails() -> None:
                raise ValueError("the file is not a model")

            assert off_thread.start_off_thread(fails, lambda result, error: done.append((result, error, True)), executor=pool)
            while len(done) < 2:
                await asyncio.sleep(0.005)

        asyncio.run(main())
    assert done[0] == ("worker_0", None, True)  # the result, on the loop's thread
    assert ended_on == [threading.main_thread().name]
    assert done[1][0] is None and isinstance(done[1][1], ValueError)


def test_start_off_thread_starts_nothing_without_a_loop_or_with_its_pool_shut_down():
    ran: list[int] = []
    assert not off_thread.start_off_thread(lambda: ran.append(1), lambda *_: ran.append(2))  # no running loop
    pool = ThreadPoolExecutor(1)
    pool.shutdown()

    async def main() -> bool:
        return off_thread.start_off_thread(lambda: ran.append(1), lambda *_: ran.append(2), executor=pool)

    assert asyncio.run(main()) is False  # the window is closing: said, not raised
    assert ran == []


def test_a_close_that_must_outlive_the_loop_runs_on_a_daemon_thread_of_its_own():
    seen: list[tuple[str, bool]] = []
    closed = threading.Event()

    def close() -> bool:
        thread = threading.current_thread()
        seen.append((thread.name, thread.daemon))
        closed.set()
        return True

    off_thread.close_in_background(close, "logitlab-test-close")
    assert closed.wait(5)
    assert seen == [("logitlab-test-close", True)]  # a daemon: a close stuck in a model never holds the exit up


APP = Path(__file__).resolve().parents[2] / "app"
_FUTURE_READS = {"done", "exception", "result", "add_done_callback", "cancelled"}


def _backend_reads(path: Path) -> list[int]:
    """Lines of `path` that get at an engine's backend: `wait_ready()`, or its `ready` future (read, or awaited
    through `wrap_future`). A Signal named `ready` (`x.ready.connect`, `.emit`) is not one."""
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "wait_ready":
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and node.attr in _FUTURE_READS and isinstance(node.value, ast.Attribute)
              and node.value.attr == "ready"):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wrap_future"
              and any(isinstance(a, ast.Attribute) and a.attr == "ready" for a in node.args)):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_the_app_never_holds_a_backend(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("b = engine.wait_ready()\nengine.ready.done()\nawait asyncio.wrap_future(engine.ready)\n"
                      "self.ready.connect(f)\nengine.is_loaded\nawait asyncio.wrap_future(engine.loaded)\n")
    assert _backend_reads(sample) == [1, 2, 3]  # the check sees them where they are
    found = {str(p.relative_to(APP)): lines for p in sorted(APP.rglob("*.py")) if (lines := _backend_reads(p))}
    assert not found, (f"the app gets at an engine's backend in {found}: use Engine.loaded (its ModelInfo) or "
                       "Engine.is_loaded")


def test_an_engines_loaded_future_gives_its_model_info_or_the_loads_error():
    from engine import Engine  # noqa: PLC0415 - the engine, for this test only
    from engine.backends.mock import MockBackend  # noqa: PLC0415

    engine = Engine.from_backend(MockBackend())
    try:
        info = engine.loaded.result(10)
        assert info == engine.info and engine.is_loaded
    finally:
        engine.close()

    def fails() -> MockBackend:
        raise ValueError("the file is not a model")

    from engine.worker import ModelWorker  # noqa: PLC0415

    broken = Engine(ModelWorker(fails))
    try:
        assert isinstance(broken.loaded.exception(10), ValueError)
        assert not broken.is_loaded
    finally:
        broken.close()
