"""The app talks to the engine only through `engine`'s public API and never imports a model runtime."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import engine

APP = Path(__file__).resolve().parents[2] / "app"
FORBIDDEN = ("torch", "mlx", "mlx_lm", "transformers", "llama_cpp")


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for every import statement in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def test_app_sources_import_only_engines_public_api_and_no_model_runtime():
    files = sorted(APP.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        for module, names in _imports(path):
            root = module.split(".")[0]
            assert root not in FORBIDDEN, f"{path.name} imports {module}"
            if root == "engine":
                assert module == "engine", f"{path.name} imports {module}: use `from engine import ...`"
                unknown = [n for n in names if n not in engine.__all__]
                assert not unknown, f"{path.name} imports {unknown}, which are not in engine.__all__"


def test_importing_and_building_the_window_loads_no_model_runtime(tmp_path):
    """In a fresh interpreter: import every app module, build the window; torch & co stay unloaded."""
    modules = sorted(
        ".".join(p.relative_to(APP.parent).with_suffix("").parts) for p in APP.rglob("*.py") if p.name != "__main__.py"
    ) + ["app.__main__"]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from app.controllers.engine_host import EngineHost\n"
        "from app.main_window import MainWindow\n"
        "from app.state.database.store import Store\n"
        "w = MainWindow(Store(':memory:'), EngineHost())\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "LOGITLAB_DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=APP.parent, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def _method_calls(source: str, name: str, filename: str = "<app>") -> list[int]:
    """Lines of `source` that call a method called `name` on anything (`x.name(...)`)."""
    return [node.lineno for node in ast.walk(ast.parse(source, filename))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name]


def test_the_app_never_runs_its_own_code_on_the_raw_backend():
    """`Engine.call(fn)` hands `fn` the loaded backend itself, on the model's thread: engine code, the CLI and
    benchmarks use it; the window asks the engine for what it needs by name (`Engine.start_layer_capture`,
    `start_loom_rows`, `start_score`, the steering ones...), so it never holds a backend. Step mode is an
    argument of `Engine.submit`, not a wrapped engine."""
    assert _method_calls("engine.call(lambda backend: backend.info)", "call") == [1]  # the check sees one
    found = {str(p.relative_to(APP)): lines for p in sorted(APP.rglob("*.py"))
             if (lines := _method_calls(p.read_text(), "call", str(p)))}
    assert not found, f"the app calls .call(...) (the raw backend) at {found}: add an Engine method for it"
    stepped = [p.name for p in APP.rglob("*.py") if "SteppedEngine" in p.read_text() or "engine_for_run" in p.read_text()]
    assert not stepped, f"{stepped} wrap the engine for step mode: pass step= to Engine.submit / TokenStream"
