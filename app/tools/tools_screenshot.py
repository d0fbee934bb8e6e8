"""`python -m app.tools.tools_screenshot [--model M] [--backend B] [--size WxH] OUT_DIR`: docs/tools.md's picture.

The default model (llama.cpp by default here, as the window's tool tests run it) is offered two tools from a
tools.json loaded in the Tools panel (`get_weather`, `add`), the panel's tool choice set to "required" (the
135M model seldom calls under "auto": its p(call) is about 1%), and asked for the weather in Paris, greedily.
The answer is a constrained call; its block in the chat shows the call, what the model decided (call vs
text, which tool, each argument's value) and the branch buttons, with the Tools dock raised beside it
(below 1200 pixels wide the left docks are hidden, so the block keeps its width). One picture,
`tools-WxH.png`. Runs in a temporary data dir, so the user's chats are never touched.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the window's module is imported late (it pulls in the whole UI)
    from app.main_window import MainWindow

log = logging.getLogger(__name__)

QUESTION = "What is the weather in Paris?"
SIZE = (1440, 900)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather now in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                      "b": {"type": "number"}},
                                                     "required": ["a", "b"]}}},
]


async def take_tools_screenshot(window: MainWindow, out_dir: str | Path, size: tuple[int, int] = SIZE) -> Path:
    from PySide6.QtWidgets import QDockWidget

    from app.tools.screenshots import _save, _settle, ready_window
    from app.widgets.tool_calls.tools_panel import ToolsPanel

    out = await ready_window(window, out_dir, size)
    window.settings.apply_preset("Greedy")
    window.settings.set_max_new_tokens(60)
    tools_file = Path(tempfile.mkdtemp(prefix="logitlab-tools-")) / "tools.json"
    tools_file.write_text(json.dumps(TOOLS, indent=2), encoding="utf-8")
    # The docks are made from main_window.DOCKS; the Tools dock is not among the attributes it declares.
    dock: QDockWidget = getattr(window, "tools_dock")
    panel = dock.widget()
    assert isinstance(panel, ToolsPanel)  # tools_panel_for's widget, as the dock holds it
    if not panel.state.load_file(tools_file):
        raise SystemExit(f"the Tools panel refused {tools_file}")
    panel.state.set_choice("required")
    answer = await window.controller.send(QUESTION)
    if answer is None or answer.finish_reason != "tool_calls":
        raise SystemExit(f"the model did not call a tool: {answer.stats if answer else None}")
    dock.raise_()
    if size[0] < 1200:
        # Narrow windows: the left docks (the chat list, tabbed with Sampling and Steering: nothing of this
        # picture) are hidden so the call block gets their width; beside them its labels wrap to six lines and
        # the block's layout clips the last one.
        for left in (window.chats_dock, window.sampling_dock, window.steering_dock):
            left.hide()
    await _settle(0.8)
    w, h = size
    path = out / f"tools-{w}x{h}.png"
    _save(window, path)
    return path


def run(argv: list[str] | None = None) -> int:
    from app.tools.shot_runner import run_shot

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--backend" not in argv:
        argv += ["--backend", "llamacpp"]  # the default GGUF, as the window's tool-call tests run it
    return run_shot(argv, "python -m app.tools.tools_screenshot", take_tools_screenshot)


if __name__ == "__main__":
    sys.exit(run())
