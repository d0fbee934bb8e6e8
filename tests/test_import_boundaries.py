"""The boundary of DESIGN.md, engine side: engine/ never imports Qt or app (tests/app/test_boundaries.py checks app/)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"engine": {"PySide6", "qasync", "app", "shiboken6"}}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_packages_import_only_what_their_side_may():
    violations = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            bad = imported_roots(path) & forbidden
            if bad:
                violations.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_importing_the_engine_api_loads_no_ml_framework():
    """The app imports `engine`; that alone must not drag torch/mlx/transformers in (start-up time, boundary)."""
    code = (
        "import sys, engine, engine.research; "
        "print(sorted(m for m in ('torch', 'mlx', 'transformers', 'llama_cpp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
