"""The window's entry points to the sampling experiments (Chat ▸ Compare / Replay / Score, File ▸ Export trace).

Kept apart from `main_window.py`: each takes the window and opens a view or
writes a file; the menus call them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine import experiments
from PySide6.QtWidgets import QFileDialog

from app.experiments import trace_lines
from app.state.conversation import Message
from app.widgets.compare_view import CompareView
from app.widgets.replay_view import ReplayView
from app.widgets.score_view import ScoreView

if TYPE_CHECKING:
    from app.main_window import MainWindow


def chosen_answer(w: "MainWindow") -> Message | None:
    """The selected token's answer, else the last answer on screen."""
    conv = w.library.current
    if conv is None:
        return None
    selected = conv.messages.get(w.selection.message_id) if w.selection.message_id is not None else None
    if selected is not None and selected.is_assistant:
        return selected
    return next((m for m in reversed(conv.path()) if m.is_assistant), None)


def open_compare(w: "MainWindow") -> CompareView:
    """Compare settings on the last question of the open conversation (or a new prompt)."""
    conv = w.library.current
    anchor = None
    if conv is not None:
        user = next((m for m in reversed(conv.path()) if m.role == "user"), None)
        if user is not None:
            anchor = (conv, user)
    view = CompareView(w.library, w.settings, w.host, anchor, parent=w)
    view.show()
    return view


def open_replay(w: "MainWindow", with_change: bool) -> ReplayView | None:
    """Replay the chosen answer (at once), or open "Replay with…" to change one setting first."""
    conv, answer = w.library.current, chosen_answer(w)
    if conv is None or answer is None:
        w.status.showMessage("There is no answer to replay yet.", 6000)
        return None
    if answer.generating:
        w.status.showMessage("Wait for the answer to finish before replaying it.", 6000)
        return None
    try:
        view = ReplayView(conv, answer, w.host, with_change=with_change, parent=w)
    except ValueError as e:
        w.status.showMessage(str(e), 8000)
        return None
    view.show()
    if not with_change:
        view.run()
    return view


def open_score(w: "MainWindow") -> ScoreView:
    view = ScoreView(w.host, w.library.current, parent=w)
    view.show()
    return view


def export_trace(w: "MainWindow", path: str | Path | None = None) -> Path | None:
    """Write the chosen answer's JSONL trace (header, one line per token, end)."""
    conv, answer = w.library.current, chosen_answer(w)
    if conv is None or answer is None:
        w.status.showMessage("There is no answer to export yet.", 6000)
        return None
    if path is None:
        chosen, _ = QFileDialog.getSaveFileName(w, "Export trace", "trace.jsonl", "JSON lines (*.jsonl)")
        if not chosen:
            return None
        path = chosen
    out = Path(path)
    try:
        n = experiments.write_trace(out, trace_lines(conv, answer, w.host.engine))
    except (OSError, ValueError) as e:
        w.status.showMessage(f"Could not export the trace: {e}", 10000)
        return None
    w.status.showMessage(f"Trace of {n - 2} tokens written to {out}", 6000)
    return out
