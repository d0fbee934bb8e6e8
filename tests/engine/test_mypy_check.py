"""The type check's bookkeeping (.ci/mypy_check.py): a baseline file read, a mypy report counted per package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check_module():
    spec = importlib.util.spec_from_file_location("mypy_check", ROOT / ".ci" / "mypy_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_errors_are_counted_per_package_and_notes_and_other_packages_are_not():
    check = _check_module()
    report = (
        "engine/a.py:3: error: Incompatible types  [assignment]\n"
        "engine/sub/b.py:10: note: By default the bodies of untyped functions are not checked\n"
        "app/widgets/c.py:1: error: Name \"x\" is not defined  [name-defined]\n"
        "app/d.py:7: error: Item \"None\" has no attribute \"y\"  [union-attr]\n"
        "tests/e.py:2: error: not a package the baseline names  [misc]\n"
        "Found 4 errors in 4 files (checked 9 source files)\n"
    )
    assert check.count_errors(report, ["engine", "app"]) == {"engine": 1, "app": 2}
    assert check.count_errors("Success: no issues found in 3 source files\n", ["engine"]) == {"engine": 0}


def test_the_checked_in_baseline_names_engine_at_zero():
    check = _check_module()
    allowed = check.read_baseline((ROOT / ".ci" / "mypy_baseline.txt").read_text())
    assert allowed["engine"] == 0 and allowed["app"] >= 0
    assert check.read_baseline("# comment\n\nengine 0  # none\napp 12\n") == {"engine": 0, "app": 12}
