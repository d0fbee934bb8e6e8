"""`python -m app.tools.steering_screenshot [--model M] [--backend B] [--size WxH] OUT_DIR`: docs/steering.md's pictures.

The default model (llama.cpp by default here: its control vectors) gets a
"happy" vector trained in the Steering panel from 16 pairs of the built-in
happy-sad set, at strength 1.5; it answers a question under it. Two pictures,
named after the size:

- `steering-panel-WxH.png`: the Steering tab raised beside Sampling, the vector and its slider;
- `steering-effect-WxH.png`: the answer in the token view coloured by steering effect (KL per token),
  a strongly steered token selected and the inspector's Steering tab comparing it with the unsteered
  distribution.

Runs in a temporary data dir with a fixed seed, so retakes look alike.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the window's module is imported late (it pulls in the whole UI)
    from app.main_window import MainWindow

log = logging.getLogger(__name__)

QUESTION = "Tell me about your weekend in two sentences."
SIZE = (1440, 900)
PAIRS = 16
STRENGTH = 1.5


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    # Plain sleeps, not processEvents: the work waited for is a task of its own, which Qt's event processing
    # inside this task would try to step re-entrantly (qasync refuses, and the task is lost).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        await asyncio.sleep(0.1)


async def take_steering_screenshots(window: MainWindow, out_dir: str | Path, size: tuple[int, int] = SIZE) -> list[Path]:
    from app.tools.screenshots import _save, _settle, ready_window

    out = await ready_window(window, out_dir, size)
    state, jobs, panel = window.controller.steering, window.controller.steering_jobs, window.steering_panel
    await _until(lambda: state.can_steer is not None, 60, "the model's steering shape")
    if not state.can_steer:
        assert window.host.info is not None  # ready_window waited for the model
        raise SystemExit(f"{window.host.info.name} cannot be steered here: {jobs.cannot_steer_text()}")
    window.settings.apply_preset("Balanced")
    window.settings.update_sampler(seed=11)
    window.settings.set_max_new_tokens(48)
    window.steering_dock.raise_()
    panel.pairs_box.setCurrentIndex(panel.pairs_box.findData("happy-sad"))
    panel.count_box.setValue(PAIRS)
    panel.name_edit.setText("happy")
    await panel.start_training()
    vector = state.vectors[-1]
    panel._rows[vector.digest].spin.setValue(STRENGTH)
    answer = await window.controller.send(QUESTION)
    await _settle(0.6)
    w, h = size
    panel_path = out / f"steering-panel-{w}x{h}.png"
    _save(window, panel_path)

    conv = window.library.current
    assert answer is not None and conv is not None  # send() answers a non-empty prompt, in the open chat
    window.view_options.set_mode("steering")
    window.view_options.set_heatmap(True)
    shadows = jobs.shadows
    await _until(lambda: shadows.kl(conv, answer) is not None or answer.id in shadows.errors, 120, "the shadow")
    kl = shadows.kl(conv, answer)
    index = int(kl.argmax()) if kl is not None else 0
    window.selection.set(answer.id, index)
    window.inspector_dock.raise_()
    view = window.inspector.steering_view
    window.inspector.tabs.setCurrentWidget(view)
    view.compare()
    await _until(lambda: view.view is not None, 120, "the steering effect")
    await _settle(0.8)
    effect_path = out / f"steering-effect-{w}x{h}.png"
    _save(window, effect_path)
    return [panel_path, effect_path]


def run(argv: list[str] | None = None) -> int:
    from app.tools.shot_runner import run_shot

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--backend" not in argv:
        argv += ["--backend", "llamacpp"]  # control vectors through llama.cpp's own API
    return run_shot(argv, "python -m app.tools.steering_screenshot", take_steering_screenshots)


if __name__ == "__main__":
    sys.exit(run())
