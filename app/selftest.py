"""`logitlab --self-test`: open the window, load a model, answer one prompt, report timings, exit.

For checking a packaged build end to end (tests/packaging/test_bundle.py) and
for measuring it: it runs the real window, the real engine host and the real
chat controller, exactly as a person would, then closes the window the
normal way. It uses a temporary data folder unless `--data-dir` is given,
so a user's conversations and settings are never touched; the model cache
(the converted default model) is the user's as usual.

The report is one line on stdout, `LOGITLAB_SELFTEST {json}`, and the same
JSON in `--report FILE` (a windowed app may have no stdout). Times are
seconds; `*_at` fields are Unix times, so a caller that noted when it
started the process can compute the cold start itself. Exit status: 0 when
the answer has at least one token and no error, 1 when loading or
generating failed, 2 on timeout, 3 when a signal (SIGTERM, SIGHUP, SIGINT)
closed the window first.

It starts the app as `python -m app` does (app/lifecycle.py: database
recovery, the start-up notice, quit signals), so the reliability tests
(tests/app/test_reliability.py) drive it too: `--progress` prints a
`LOGITLAB_EVENT {json}` line as tokens arrive, `--fail-writes-after N` makes
the database refuse writes after N tokens, `--cycles N` runs send/stop
cycles and reports threads and memory, `--no-prompt` only opens the window
and reports what it shows, and `--hold` keeps the window open until it is
closed (by a signal) — see app/selftest_checks.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from engine import BACKENDS

if TYPE_CHECKING:  # imported late: the report times the app's imports
    from app.main_window import MainWindow

SELFTEST_FLAG = "--self-test"
REPORT_PREFIX = "LOGITLAB_SELFTEST "
DEFAULT_PROMPT = "What is the capital of France?"

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="logitlab --self-test", description=__doc__.splitlines()[0])
    p.add_argument(SELFTEST_FLAG, dest="self_test", action="store_true", required=True)
    p.add_argument("--tokens", type=int, default=8, help="answer length in tokens (default: 8)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--model", help="a model folder, .gguf file or hub id (default: the default model)")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds (default: 600)")
    p.add_argument("--data-dir", help="use this data folder instead of a temporary one")
    p.add_argument("--report", help="also write the JSON report to this file")
    p.add_argument(
        "--download", action="store_true", help="first download the default model into the user models folder"
    )
    p.add_argument("--screenshot", help="save a picture of the window with the answer to this PNG file")
    p.add_argument("--preset", default="Greedy", help="the sampler preset to answer with (default: Greedy)")
    p.add_argument("--progress", action="store_true", help="print a LOGITLAB_EVENT line as tokens arrive")
    p.add_argument("--no-prompt", action="store_true", help="load nothing, send nothing: report what the window shows")
    p.add_argument("--fail-writes-after", type=int, metavar="N", help="the database refuses writes after N tokens")
    p.add_argument("--cycles", type=int, default=0, metavar="N", help="then N rapid send/stop cycles (threads, memory)")
    p.add_argument("--hold", action="store_true", help="at the end keep the window open until it is closed")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def process_start_time() -> float | None:
    """When this process started (Unix time, ~10 ms), from /proc on Linux; None elsewhere."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        # Field 22 is starttime in clock ticks after boot; field 2 (the command) may contain spaces.
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def run(argv: list[str] | None = None) -> int:
    """Run the self-test; the exit status is the result."""
    args = parse_args(argv)
    report: dict = {"ok": False, "frozen": bool(getattr(sys, "frozen", False)), "process_start_at": process_start_time()}
    from app.logs import setup_logging

    report["log_file"] = str(setup_logging(args.verbose))
    temp_dir = None
    if args.data_dir:
        os.environ["LOGITLAB_DATA_DIR"] = args.data_dir
    else:
        temp_dir = tempfile.mkdtemp(prefix="logitlab-selftest-")
        os.environ["LOGITLAB_DATA_DIR"] = temp_dir

    import qasync

    from app import __version__
    from app.application import application

    report["imports_done_at"] = time.time()
    qt_app = application()  # as app.__main__.run makes it, so the self-test shows what a user sees
    report["version"] = __version__
    report["qt_platform"] = qt_app.platformName()
    try:
        with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
            code = runner.run(_self_test(args, report))
    finally:
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["exit_status"] = code
    _emit(report, args.report)
    return code


async def _self_test(args: argparse.Namespace, report: dict) -> int:
    from PySide6.QtWidgets import QApplication

    from app.lifecycle import close_session, open_session
    from app.selftest_checks import emit_event, hold, summarize_window

    session = open_session("system")
    window = session.window
    code = 1
    try:
        await _until(lambda: window.windowHandle() is not None and window.windowHandle().isExposed(), 30.0)
        QApplication.processEvents()  # the first paint
        report["window_visible_at"] = time.time()
        report["window_title"] = window.windowTitle()
        report["window_icon"] = not window.windowIcon().isNull()
        report["start"] = summarize_window(window)
        emit_event("window", **report["start"])
        if args.no_prompt:
            code = 0
        else:
            code = await asyncio.wait_for(_load_and_answer(window, args, report), args.timeout)
        if window._closing:
            code = 3  # a signal closed the window
        elif args.hold:
            await hold(session, args.timeout)
            code = 3 if window.controller._interrupted_by else code
    except TimeoutError:
        report["error"] = f"timed out after {args.timeout:g} s"
        code = 2
    except Exception as e:  # noqa: BLE001 - reported, and the status says it failed
        log.exception("self-test failed")
        report["error"] = f"{type(e).__name__}: {e}"
        code = 1
    finally:
        report["end"] = summarize_window(window)
        await close_session(session)
    report["interrupted_by"] = window.controller._interrupted_by
    report["ok"] = code == 0
    return code


async def _load_and_answer(window: MainWindow, args: argparse.Namespace, report: dict) -> int:
    if args.download:
        from engine import download_default_model  # the real download; fails fast without a network

        from app.controllers.off_thread import run_off_thread

        t_download = time.perf_counter()
        try:
            with ThreadPoolExecutor(1) as pool:  # not the loop's executor: qasync's QThreads outlive the loop
                path = await run_off_thread(lambda _state: download_default_model(), executor=pool)
        except Exception as e:  # noqa: BLE001 - reported
            report["download"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            report["error"] = f"downloading the default model failed: {e}"
            return 1
        finally:
            report["download_s"] = round(time.perf_counter() - t_download, 3)
        report["download"] = {"ok": True, "path": str(path)}
    t_load = time.perf_counter()
    ok = await window.start(args.model, args.backend)
    report["model_load_s"] = round(time.perf_counter() - t_load, 3)
    report["model_loaded_at"] = time.time()
    if not ok:
        box = window.models.error_box
        report["error"] = "loading the model failed: " + (box.text() if box is not None else "no message")
        return 1
    info = window.host.info
    assert info is not None  # start() said the model loaded
    report["model"] = {"name": info.name, "backend": info.backend, "device": info.device, "dtype": info.dtype}

    from app.selftest_checks import fail_writes_after, report_progress, send_stop_cycles

    window.settings.apply_preset(args.preset)
    window.settings.set_max_new_tokens(args.tokens)
    conv = window.library.new()
    first_token_at: list[float] = []

    def note_first_token(_message: object, _index: object) -> None:
        if not first_token_at:
            first_token_at.append(time.perf_counter())

    conv.tokens_appended.connect(note_first_token)
    if args.progress:
        report_progress(conv)
    if args.fail_writes_after is not None:
        fail_writes_after(window, conv, args.fail_writes_after)
    t_send = time.perf_counter()
    report["prompt"] = args.prompt
    answer = await window.controller.send(args.prompt)
    report["answer_s"] = round(time.perf_counter() - t_send, 3)
    if first_token_at:
        # Wall time from pressing Send to the first token reaching the conversation (what a person waits).
        report["first_token_s"] = round(first_token_at[0] - t_send, 3)
    stats = (answer.stats if answer is not None else None) or {}  # an answer's stats may be None (Message.stats)
    report["answer"] = answer.content if answer is not None else None
    report["stats"] = {
        k: stats.get(k)
        for k in ("finish_reason", "prompt_tokens", "generated_tokens", "time_to_first_token_s", "decode_tokens_per_s")
    }
    tokens = conv.tokens(answer) if answer is not None else []
    report["tokens"] = len(tokens)
    if args.screenshot:
        await asyncio.sleep(0.3)  # the last frame batch and the status bar
        window.grab().save(args.screenshot)
    if answer is None or not tokens or answer.finish_reason == "error":
        report["error"] = "no answer: " + str(stats.get("error") or "no tokens were generated")
        return 1
    if args.cycles and not window._closing:
        report["cycles"] = await send_stop_cycles(window, args.prompt, args.cycles)
    return 0


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s:g} s")
        await asyncio.sleep(0.005)


def _emit(report: dict, path: str | None) -> None:
    start = report.get("process_start_at")
    for key in ("imports_done_at", "window_visible_at", "model_loaded_at"):
        if start and report.get(key):
            report[key.replace("_at", "_since_start_s")] = round(report[key] - start, 3)
    text = json.dumps(report, ensure_ascii=False)
    if path:
        Path(path).write_text(text + "\n", encoding="utf-8")
    log.info("self-test %s: %s", "passed" if report["ok"] else "FAILED", text)
    print(REPORT_PREFIX + text, flush=True)


def main() -> None:
    """`python -m app.selftest --self-test ...`."""
    sys.exit(run())


if __name__ == "__main__":
    main()
