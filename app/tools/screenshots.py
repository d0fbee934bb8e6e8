"""`python -m app --screenshot-dir docs/`: drive the window to the README's states and save PNGs.

Runs against whatever model the window loads (the default one normally),
in a temporary data dir, with a fixed seed so retakes look alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from engine import TokenEvent

from PySide6.QtWidgets import QApplication, QWidget

from app.main_window import MainWindow

log = logging.getLogger(__name__)

PROMPT = "Why is the sky blue? Answer in a short paragraph."
SIZE = (1440, 900)


async def _settle(seconds: float = 0.4) -> None:
    """Let layouts, Markdown renders and repaints finish."""
    for _ in range(3):
        QApplication.processEvents()
        await asyncio.sleep(seconds / 3)


def _save(window: QWidget, path: Path) -> None:  # the main window, or one it opened (Compare)
    window.grab().save(str(path))
    log.info("saved %s", path)


async def ready_window(window: MainWindow, out_dir: str | Path, size: tuple[int, int]) -> Path:
    """The window at `size`, light, its model loaded and laid out; returns `out_dir`, created."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    window.resize(*size)
    if window.theme is not None:
        window.theme.set_scheme("light")
    await window.host.wait_engine()
    await _settle()
    return out


def _interesting_token(tokens: Sequence[TokenEvent]) -> int:
    """A token where sampling mattered: not the top choice, or else the least likely, with stages recorded."""
    candidates = [i for i, t in enumerate(tokens[:60]) if t.stages and not t.special and t.token_text.strip()]
    not_top = [i for i in candidates if tokens[i].rank > 0]
    pool = not_top or candidates or [0]
    return min(pool, key=lambda i: tokens[i].prob)


async def take_screenshots(window: MainWindow, out_dir: str | Path) -> list[Path]:
    out = await ready_window(window, out_dir, SIZE)
    if window.host.loading:  # a picked model still loading
        await window.host.wait_engine()
    window.settings.apply_preset("Balanced")
    window.settings.update_sampler(seed=7)
    window.settings.set_max_new_tokens(96)
    window.library.new()
    answer = await window.controller.send(PROMPT)
    conv = window.library.current
    assert answer is not None and conv is not None

    # (a) the chat with the token heatmap on
    window.view_options.set_mode("probability")
    window.view_options.set_heatmap(True)
    window.selection.clear()
    window.sampling_dock.raise_()  # show the sampling controls in this one
    await _settle()
    shots = [out / "chat-heatmap.png"]
    _save(window, shots[-1])

    # (b) the inspector on a selected token, showing the per-stage view
    tokens = conv.tokens(answer)
    index = _interesting_token(tokens)
    window.selection.set(answer.id, index)
    window.chats_dock.raise_()
    window.inspector.tabs.setCurrentWidget(window.inspector.stages)
    await _settle()
    shots.append(out / "inspector-stages.png")
    _save(window, shots[-1])

    # (c) a branch: the same token replaced by an alternative; the answer now shows "2 / 2"
    chosen = tokens[index]
    alt = next(p for p in chosen.top_model if p.token_id != chosen.token_id)
    await window.controller.branch(answer, index, alt.token_id)
    window.inspector.tabs.setCurrentIndex(0)
    await _settle()
    window.chat.chat_view.scroll_to_bottom()
    await _settle()
    shots.append(out / "branch.png")
    _save(window, shots[-1])

    # (d) dark mode
    if window.theme is not None:
        window.theme.set_scheme("dark")
    await _settle(0.6)
    shots.append(out / "dark.png")
    _save(window, shots[-1])
    return shots
