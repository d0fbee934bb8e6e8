"""The window's entry points to the sampling experiments and to exports (Chat ▸ Compare / Replay / Score,
File ▸ Export as Markdown / JSON / trace).

Each takes an `ActionContext` (the state, the engine, a parent for dialogs),
never the window, and opens a view or writes a file. A file that cannot be
written is one dialog with the reason; nothing is lost (the conversation stays).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine import atomic_text_file, experiments, write_text_atomic

from app.actions.context import ActionContext
from app.state.answer_recipe import trace_lines
from app.state.conversation import Message
from app.state.export import to_json, to_markdown
from app.state.json_safe import json_safe
from app.state.models.model_match import made_by_other_model
from app.state.models.model_record import model_record
from app.widgets.experiment_windows.compare_view import CompareView
from app.widgets.dialogs.file_dialogs import save_file
from app.widgets.experiment_windows.replay_view import ReplayView
from app.widgets.experiment_windows.score_view import ScoreView

EXPORTS_FOLDER = "exports"  # the file dialogs' memory of where exports were last written


def chosen_answer(ctx: ActionContext) -> Message | None:
    """The selected token's answer, else the last answer on screen."""
    conv = ctx.library.current
    if conv is None:
        return None
    selection = ctx.selection
    selected = conv.messages.get(selection.message_id) if selection.message_id is not None else None
    if selected is not None and selected.is_assistant:
        return selected
    return next((m for m in reversed(conv.path()) if m.is_assistant), None)


def open_compare(ctx: ActionContext) -> CompareView:
    """Compare settings on the last question of the open conversation (or a new prompt)."""
    conv = ctx.library.current
    anchor = None
    if conv is not None:
        user = next((m for m in reversed(conv.path()) if m.role == "user"), None)
        if user is not None:
            anchor = (conv, user)
    view = CompareView(ctx.library, ctx.settings, ctx.host, anchor, parent=ctx.parent, steering=ctx.steering)
    view.show()
    return view


def open_replay(ctx: ActionContext, with_change: bool) -> ReplayView | None:
    """Replay the chosen answer (at once), or open "Replay with…" to change one setting first."""
    conv, answer = ctx.library.current, chosen_answer(ctx)
    if conv is None or answer is None:
        ctx.notify("There is no answer to replay yet.", 6000)
        return None
    if answer.generating:
        ctx.notify("Wait for the answer to finish before replaying it.", 6000)
        return None
    try:
        view = ReplayView(conv, answer, ctx.host, with_change=with_change, parent=ctx.parent, steering=ctx.steering)
    except ValueError as e:
        ctx.notify(str(e), 8000)
        return None
    view.show()
    if not with_change:
        view.run()
    return view


def open_score(ctx: ActionContext) -> ScoreView:
    view = ScoreView(ctx.host, ctx.library.current, parent=ctx.parent)
    view.show()
    return view


def export_conversation(ctx: ActionContext, kind: str, path: str | Path | None = None) -> Path | None:
    """The open conversation as Markdown (the visible path) or JSON (every branch, with token records)."""
    conv = ctx.library.current
    if conv is None:
        return None
    suffix = ".md" if kind == "markdown" else ".json"
    if path is None:
        name = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip() or "conversation"
        path = save_file(ctx.parent, ctx.store, EXPORTS_FOLDER, "Export conversation", name + suffix)
        if path is None:
            return None
    # Built inside the write: whatever fails is one dialog, and a file is written whole or not at all.
    out = _write(ctx, Path(path), "Could not export the conversation",
                 lambda p: write_text_atomic(p, to_markdown(conv) if kind == "markdown" else to_json(conv)))
    if out is not None:
        ctx.notify(f"Exported to {out}", 6000)
    return out


def export_trace(ctx: ActionContext, path: str | Path | None = None) -> Path | None:
    """Write the chosen answer's JSONL trace (header, one line per token, end)."""
    conv, answer = ctx.library.current, chosen_answer(ctx)
    if conv is None or answer is None:
        ctx.notify("There is no answer to export yet.", 6000)
        return None
    if path is None:
        path = save_file(ctx.parent, ctx.store, EXPORTS_FOLDER, "Export trace", "trace.jsonl", "JSON lines (*.jsonl)")
        if path is None:
            return None
    written: list[int] = []
    # The prompt's token ids come from the loaded model's tokenizer: another model's would not be the ids the
    # answer followed (a replay of the trace would run them), so they are left out, as with no model loaded.
    engine = ctx.host.engine
    other = engine is not None and made_by_other_model(answer.model, model_record(engine.info))

    def write(p: Path) -> None:
        # A token ban in the settings (a bias of -inf) is written as standard JSON (app/state/json_safe.py).
        lines = [json_safe(line) for line in trace_lines(conv, answer, None if other else engine)]
        with atomic_text_file(p) as f:
            written.append(experiments.write_lines(f, lines))

    out = _write(ctx, Path(path), "Could not export the trace", write)
    if out is not None:
        made = (answer.model or {}).get("name") or "another model"
        note = f"; without the prompt's token ids: the answer was made by {made}, not the model loaded" if other else ""
        ctx.notify(f"Trace of {written[0] - 2} tokens written to {out}{note}", 10000 if other else 6000)
    return out


def _write(ctx: ActionContext, out: Path, title: str, write: Callable[[Path], object]) -> Path | None:
    """Run `write(out)`; a failure is one dialog naming the file and the reason. The path, or None."""
    if out.is_dir():
        ctx.warn(title, f"{out} is a folder: choose a file name inside it.")
        return None
    try:
        write(out)
    except (OSError, ValueError, TypeError) as e:  # TypeError: a value JSON cannot hold (nothing is left written)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        if isinstance(e, FileNotFoundError):
            reason += f": the folder {out.parent} does not exist"
        ctx.warn(title, f"{out} could not be written ({reason}). Nothing was lost: choose another place.")
        return None
    return out
