"""The app's state and its controllers are Qt-free (napari's rule): they can be used, and tested, without a
QApplication, and no Qt type leaks into what they hold. Checked in a fresh interpreter, so that whatever they
import, however indirectly, is seen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
QT_FREE = ("state", "controllers", "tool_calls")


def _modules() -> list[str]:
    found = []
    for folder in QT_FREE:
        for path in sorted((APP / folder).rglob("*.py")):
            found.append(".".join(path.relative_to(APP.parent).with_suffix("").parts))
    return found


def test_state_and_controllers_import_no_qt():
    modules = _modules()
    assert any(m.startswith("app.controllers.") for m in modules) and any(m.startswith("app.state.") for m in modules)
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'qasync'))\n"
        "print('QT:' + ','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=APP.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "QT:", done.stdout
