"""Import rules inside engine/ (issue 44 item 1), in import-linter's style: which layer may not import which.

    the CLI and the server (cli/, serve/)        top: nothing below imports them
    what runs answers (decode*, loom/, experiments/, research/, engine.py, worker.py)
    the backends (backends/)                     never import what runs answers, the server or the CLI
    what a request is made of (sampling/, constraints/, tools/, documents/)   import no backend

Every import counts, a lazy one inside a function as much as one at the top (it runs all the same); an import
only for the type checker (under `if TYPE_CHECKING:`) does not. Exceptions are listed below with the reason
each one stands; a new one fails until it is listed (or the import moves to where it belongs).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"

RUNS_ANSWERS = ("engine.decode", "engine.loom", "engine.experiments",
                "engine.research", "engine.engine", "engine.worker")
TOP = ("engine.cli", "engine.serve")
BACKENDS = ("engine.backends",)

# (importer, what it may not import)
RULES: list[tuple[tuple[str, ...], tuple[str, ...], str]] = [
    (BACKENDS, RUNS_ANSWERS + TOP, "a backend runs a model; what runs answers on it stands above it"),
    (("engine.sampling", "engine.constraints", "engine.tools", "engine.documents"), BACKENDS + RUNS_ANSWERS + TOP,
     "what a request is made of is the same whichever backend runs it"),
    (("engine.library", "engine.sources"), RUNS_ANSWERS + TOP, "finding and fetching models runs no answer"),
    (("engine",), TOP, "the CLI and the server are at the top: nothing else imports them"),
]
# Which modules each rule leaves alone: the layer itself, and the package front doors that load the server
# lazily for library users (`engine.__init__`'s `__getattr__`, the documented `from engine import serve_app`).
ALSO_MAY_IMPORT = {"engine.cli": ("engine.__main__",), "engine.serve": ("engine.cli",)}  # (prefixes)
FRONT_DOORS = {"engine"}  # (exact names)

# Imports that break a rule today, each with why it stands and what would remove it.
EXCEPTIONS = {
    # The remote backend's server-sampling path (the `OwnEvents` capability) streams the server's own tokens as
    # an answer: it uses the decode loop's prompt ids and the one builder of GenerationStats rather than a copy.
    # Moving AnswerRecord/generation_stats (decode/stats.py) and prompt_ids_for (decode/loop.py) below the
    # backends removes these.
    ("engine.backends.remote.generate", "engine.decode"),
    ("engine.backends.remote.many_choices", "engine.decode"),
    ("engine.backends.remote.server_stream", "engine.decode"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _under(name: str, prefixes: tuple[str, ...]) -> str | None:
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for child in node.body for n in ast.walk(child))
    return inside


def engine_imports(path: Path, me: str | None = None) -> set[str]:
    """The engine modules `path` (module `me`, by default its name in the tree) imports at run time (absolute
    names; relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = me or module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    typing_only = _type_checking_blocks(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)  # `from engine import serve`
    return {n for n in found if n == "engine" or n.startswith("engine.")}


def rule_breaks(modules: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """(importer, the forbidden layer it imports, why the rule stands) for every import in `modules`
    ({module: the engine modules it imports}) that breaks a rule."""
    breaks = []
    for me, imported in modules.items():
        for importers, forbidden, why in RULES:
            if not _under(me, importers):
                continue
            for name in imported:
                layer = _under(name, forbidden)
                if layer is None or _under(me, (layer, *ALSO_MAY_IMPORT.get(layer, ()))) or me in FRONT_DOORS:
                    continue
                breaks.append((me, layer, why))
    return sorted(set(breaks))


@functools.cache
def engine_modules() -> dict[str, set[str]]:
    return {module_name(p): engine_imports(p) for p in sorted(ENGINE.rglob("*.py"))}


def test_engine_keeps_its_import_rules():
    breaks = rule_breaks(engine_modules())
    new = [f"{me} imports {layer}: {why}" for me, layer, why in breaks if (me, layer) not in EXCEPTIONS]
    assert not new, "\n".join(new)


def test_every_listed_exception_still_happens():
    """An exception whose import has gone is struck from the list, so the list says what is true."""
    happening = {(me, layer) for me, layer, _ in rule_breaks(engine_modules())}
    assert EXCEPTIONS <= happening, sorted(EXCEPTIONS - happening)


def test_a_backend_importing_the_server_is_caught(tmp_path):
    """The check itself, on a module written here: a lazy import inside a function is caught, a type-only one
    is not, and the server importing a backend is no break."""
    probe = tmp_path / "_rule_probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.decode import batch_loop\n"
                     "def f():\n    from engine.serve import app\n", encoding="utf-8")
    imported = engine_imports(probe, "engine.backends._rule_probe")
    assert imported == {"engine.serve", "engine.serve.app"}
    modules = {"engine.backends._rule_probe": imported, "engine.serve.app": {"engine.backends.select"}}
    assert {(me, layer) for me, layer, _ in rule_breaks(modules)} == {("engine.backends._rule_probe", "engine.serve")}
