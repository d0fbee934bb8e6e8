"""What the self-test does beyond one answer, for tests that drive the real app in a subprocess.

Each prints `LOGITLAB_EVENT {json}` lines on stdout as things happen, so a test
reading the pipe knows how far the app got before it signals or kills it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported late by the self-test, which times the app's imports
    from app.lifecycle import Session
    from app.main_window import MainWindow
    from app.state.conversation import Conversation, Message

log = logging.getLogger(__name__)

EVENT_PREFIX = "LOGITLAB_EVENT "


def emit_event(event: str, **fields: Any) -> None:
    print(EVENT_PREFIX + json.dumps({"event": event, **fields}, ensure_ascii=False), flush=True)


def summarize_window(window: MainWindow) -> dict[str, Any]:
    """What the window shows: title, the database notice, the banner, and the open conversation's messages."""
    box = window.database_box
    conv = window.library.current
    messages = []
    if conv is not None:
        for m in conv.path():
            messages.append({
                "id": m.id,
                "role": m.role,
                "finish_reason": m.finish_reason,
                "tokens": len(conv.tokens(m)) if m.is_assistant else 0,
                "interrupted_by": (m.stats or {}).get("interrupted_by"),
            })
    return {
        "window_title": window.windowTitle(),
        "notice": None if box is None else {"title": box.windowTitle(), "text": box.text()},
        "banner": window.banner.label.text() if window.banner.isVisibleTo(window) else None,
        "temporary_database": window.store.temporary,
        "conversation": {"title": conv.title, "messages": messages} if conv is not None else None,
    }


def report_progress(conv: Conversation) -> None:
    """A `tokens` event each time tokens reach the conversation (what is on screen)."""

    def on_tokens(message: Message, _start: int) -> None:
        emit_event("tokens", message_id=message.id, tokens=len(message.tokens or ()))

    conv.tokens_appended.connect(on_tokens)


def fail_writes_after(window: MainWindow, conv: Conversation, n_tokens: int) -> None:
    """Once `n_tokens` have streamed, every write fails as on a read-only database (SQLite's own error)."""

    def on_tokens(message: Message, _start: int) -> None:
        if len(message.tokens or ()) >= n_tokens and not getattr(conv, "_writes_failing", False):
            conv._writes_failing = True  # type: ignore[attr-defined]  # the self-test's own flag on this conversation
            # query_only makes SQLite refuse every write with "attempt to write a readonly database".
            window.store._conn.execute("PRAGMA query_only = ON")
            emit_event("writes_failing", tokens=len(message.tokens or ()))

    conv.tokens_appended.connect(on_tokens)


def _proc_status(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _resources() -> dict[str, Any]:
    rss_kb = _proc_status("VmRSS")
    return {
        "python_threads": sorted(t.name for t in threading.enumerate()),
        "os_threads": _proc_status("Threads"),
        "rss_mib": None if rss_kb is None else round(rss_kb / 1024, 1),
    }


async def send_stop_cycles(window: MainWindow, prompt: str, cycles: int, warmup: int = 5) -> dict[str, Any]:
    """Send and stop at once, `cycles` times, through the controller; threads and memory before and after.

    Most cycles stop at once (before or during the prompt); one in ten waits for the first token
    first, so stopping mid-decode is exercised too. A fresh chat every 10 cycles
    keeps the prompt short. Measured after `warmup` cycles, so caches and the allocator have settled.
    """
    controller = window.controller

    async def cycle(i: int) -> None:
        if i % 10 == 0:
            window.library.new()
        task = asyncio.ensure_future(controller.send(f"{prompt} ({i})"))
        if i % 10 == 5:
            deadline = time.monotonic() + 10.0
            while controller.busy and not (controller.generating_message and controller.generating_message.tokens):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.002)
        else:
            await asyncio.sleep(0)
        controller.stop()
        await asyncio.wait_for(task, 30.0)

    for i in range(warmup):
        await cycle(i)
    await asyncio.sleep(0.2)
    gc.collect()
    before = _resources()
    t0 = time.perf_counter()
    for i in range(warmup, warmup + cycles):
        await cycle(i)
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(0.5)  # let finished helper threads end
    gc.collect()
    after = _resources()
    emit_event("cycles", cycles=cycles, seconds=round(elapsed, 2))
    return {"cycles": cycles, "seconds": round(elapsed, 2), "before": before, "after": after, "pid": os.getpid()}


async def hold(session: Session, timeout_s: float) -> None:
    """Keep the window open until it closes (a signal, or the user); bounded by `timeout_s`."""
    emit_event("holding", **summarize_window(session.window))
    try:
        await asyncio.wait_for(asyncio.shield(session.closed), timeout_s)
    except TimeoutError:
        log.warning("held the window for %g s; closing it", timeout_s)
