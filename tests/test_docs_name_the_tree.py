"""docs/architecture.md and docs/window.md describe the tree as it is (issue 44 item 8).

Every module or folder the docs name exists, and architecture.md names every package of engine/ and app/
and every module at their roots: a module moved, added or deleted without its line in the docs fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
WINDOW = ROOT / "docs" / "window.md"
PATHLIKE = re.compile(r"^[\w*]+(?:/[\w*]+)*(?:\.py|/)$")
BACKTICKED = re.compile(r"`([^`]+)`")


def _section_rows(text: str, heading: str) -> list[str]:
    """The table rows under `## heading` (up to the next heading of that level or above)."""
    body = text.split(f"\n## {heading}\n", 1)[1]
    body = re.split(r"\n#{1,3} ", body, maxsplit=1)[0]
    return [line for line in body.splitlines() if line.startswith("| `")]


def _resolve(root: Path, name: str, row_dirs: list[Path]) -> list[Path]:
    """Where `name` (written in a row whose first cell names `row_dirs`) can be: the section's root, a folder
    the row is about, or that folder's parent (`backends/llamacpp/, torch/` names backends/torch)."""
    found: list[Path] = []
    for base in [root, *row_dirs, *(d.parent for d in row_dirs)]:
        found += [p for p in base.glob(name.rstrip("/")) if p.is_dir() == name.endswith("/")]
    return found


def _named(package: str, text: str | None = None) -> tuple[set[Path], list[str]]:
    """(every path the `## package/` section of architecture.md (or `text`) names, the names that resolve to nothing)."""
    root = ROOT / package
    named: set[Path] = set()
    missing: list[str] = []
    for row in _section_rows(text if text is not None else ARCHITECTURE.read_text(encoding="utf-8"), f"{package}/"):
        cells = row.split(" | ")
        first = [t for t in BACKTICKED.findall(cells[0]) if PATHLIKE.match(t)]
        row_dirs: list[Path] = []
        for t in first:
            for p in _resolve(root, t, row_dirs):
                row_dirs.append(p if p.is_dir() else p.parent)
        for t in (t for t in BACKTICKED.findall(row) if PATHLIKE.match(t)):
            paths = _resolve(root, t, row_dirs)
            if paths:
                named.update(paths)
            else:
                missing.append(t)
    return named, missing


def _unnamed(package: str, text: str | None = None) -> list[str]:
    named, _ = _named(package, text)
    return sorted(p.relative_to(ROOT).as_posix() for p in _tree(package) - named)


def _tree(package: str) -> set[Path]:
    """engine's or app's packages (every folder with an __init__.py below the top) and its root modules."""
    root = ROOT / package
    packages = {p.parent for p in root.rglob("__init__.py") if p.parent != root}
    modules = {p for p in root.glob("*.py") if p.name != "__init__.py"}
    return packages | modules


def test_every_module_and_folder_architecture_names_exists():
    for package in ("engine", "app"):
        _, missing = _named(package)
        assert not missing, f"docs/architecture.md names in {package}/ what is not there: {missing}"


def test_architecture_names_every_package_and_root_module():
    for package in ("engine", "app"):
        unnamed = _unnamed(package)
        assert not unnamed, f"docs/architecture.md does not say what these are: {unnamed}"


def test_every_path_window_md_names_exists():
    text = WINDOW.read_text(encoding="utf-8")
    missing = []
    for t in BACKTICKED.findall(text):
        if not PATHLIKE.match(t) or "/" not in t.rstrip("/"):
            continue
        candidates = [ROOT / t.rstrip("/"), ROOT / "app" / t.rstrip("/"), ROOT / "engine" / t.rstrip("/")]
        if not any(c.exists() for c in candidates):
            missing.append(t)
    assert not missing, f"docs/window.md names what is not there: {missing}"


def test_a_module_or_package_left_out_of_the_docs_is_found():
    """The check itself: a root module and a package struck from the text are reported, a made-up one too."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    struck = text.replace("`cache_schedule.py`", "`cache schedule`").replace("| `documents/` |", "| documents |")
    assert _unnamed("engine", struck) == ["engine/cache_schedule.py", "engine/documents"]
    invented = text.replace("| `chat.py` |", "| `chat.py`, `chats_of_old.py` |")
    assert _named("engine", invented)[1] == ["chats_of_old.py"]
