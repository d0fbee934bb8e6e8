"""No function in engine/ or app/ runs over 80 lines (issue 44 item 5): long wiring becomes named parts,
tables and small objects. The functions still over it are listed below with their length today; the list
may only shrink: a listed function that is now short enough, or gone, fails too, so the list stays true.

A function's length is its `def` line (decorators not counted) to its last line, as `ast` counts it
(`end_lineno - lineno + 1`); a function is named by its file and its qualified name (`Class.method`,
`outer.inner`), never by a line number.

Parsing all of engine/ and app/ takes seconds on two busy cores, so the text is read first: with its strings
and comments blanked out, a function ends at the latest before the next statement that is indented no deeper
than its `def`. Only the files where that bound passes 80 lines are parsed; the slow test checks that the
bound never misses what a full parse finds.
"""

from __future__ import annotations

import ast
import gc
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("engine", "app")
MAX_LINES = 80

# "path:qualified name": its length today, for a function that must stay long for a while (none is, now: keep
# it so; a function over the limit is split into named parts instead).
ALLOWED: dict[str, int] = {}

# A comment, or a string (prefix letters stay behind as harmless text): matched left to right, as the
# tokenizer reads them, so a quote inside a comment and a # inside a string are each taken for what they are.
_STRING_OR_COMMENT = re.compile(
    r'#[^\n]*|"""(?:\\.|[^\\])*?"""|' r"'''(?:\\.|[^\\])*?'''|" r'"(?:\\.|[^"\\\n])*"|' r"'(?:\\.|[^'\\\n])*'",
    re.DOTALL,
)
_INSIDE = "\x01"  # starts each line that begins inside a string: never a statement's first line
_DEF = re.compile(r"(?:async\s+)?def\s")


def _blank_strings(source: str) -> str:
    """`source` without its comments, each string reduced to a mark, its lines kept (the later ones marked)."""
    return _STRING_OR_COMMENT.sub(_mark, source)


def _mark(match: re.Match[str]) -> str:
    """A comment goes (a line holding only one is blank); a string leaves a mark, and its later lines' marks."""
    text = match.group()
    return "" if text.startswith("#") else "s" + ("\n" + _INSIDE) * text.count("\n")


def longest_bound(source: str) -> tuple[int, int]:
    """(functions, the longest any of them can be) from the text alone: never less than `ast` counts."""
    lines = _blank_strings(source).split("\n")
    open_defs: list[tuple[int, int]] = []  # (indent, line) of each def not yet ended, innermost last
    longest = defs = depth = 0
    continued = False  # the last line ended in a backslash
    for number, line in enumerate(lines, 1):
        starts = depth == 0 and not continued and not line.startswith(_INSIDE)
        depth += line.count("(") + line.count("[") + line.count("{")
        depth -= line.count(")") + line.count("]") + line.count("}")
        continued = line.endswith("\\")
        if not starts:
            continue
        text = line.lstrip()
        if not text:
            continue
        indent = len(line) - len(text)
        while open_defs and open_defs[-1][0] >= indent:  # a statement no deeper: those defs have ended
            longest = max(longest, number - open_defs.pop()[1])
        if _DEF.match(text):
            defs += 1
            open_defs.append((indent, number))
    for _indent, start in open_defs:
        longest = max(longest, len(lines) - start + 1)
    return defs, longest


def _functions(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Every function in a module (methods and nested ones too): its qualified name and its length."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):  # where statements are
            for child in getattr(node, field, ()):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    assert child.end_lineno is not None
                    yield f"{prefix}{child.name}", child.end_lineno - child.lineno + 1
                    stack.append((f"{prefix}{child.name}.", child))
                elif isinstance(child, ast.ClassDef):
                    stack.append((f"{prefix}{child.name}.", child))
                else:
                    stack.append((prefix, child))


def _parsed_lengths(relative: str, source: str) -> dict[str, int]:
    """"path:qualified name" -> lines for each function in one file, parsed (a name defined twice: its longer)."""
    lengths: dict[str, int] = {}
    collecting = gc.isenabled()
    gc.disable()  # a tree is thousands of objects the collector need not scan
    try:
        for name, lines in _functions(ast.parse(source, filename=relative)):
            key = f"{relative}:{name}"
            lengths[key] = max(lines, lengths.get(key, 0))
    finally:
        if collecting:
            gc.enable()
    return lengths


def _sources() -> Iterator[tuple[str, str]]:
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


@cache  # read once for the two tests that ask
def long_functions() -> tuple[int, dict[str, int]]:
    """(functions seen, "path:qualified name" -> lines of each function over MAX_LINES) in engine/ and app/."""
    seen, long = 0, {}
    for relative, source in _sources():
        defs, bound = longest_bound(source)
        seen += defs
        if bound > MAX_LINES:
            long.update({k: n for k, n in _parsed_lengths(relative, source).items() if n > MAX_LINES})
    return seen, long


def test_no_function_is_over_80_lines() -> None:
    seen, long = long_functions()
    assert seen > 1000, "the walk found too few functions to be looking at engine/ and app/"
    too_long = {key: lines for key, lines in long.items() if key not in ALLOWED}
    assert not too_long, (
        f"over {MAX_LINES} lines: split into named parts (a table, a small object, the steps it takes): "
        + ", ".join(f"{key} ({lines})" for key, lines in sorted(too_long.items()))
    )


def test_the_allow_list_only_shrinks() -> None:
    """Each listed function is still there and still over the limit, and no longer than it was listed."""
    _seen, long = long_functions()
    done = [key for key in ALLOWED if key not in long]
    assert not done, f"now {MAX_LINES} lines or fewer, or gone: take them out of ALLOWED: {done}"
    grown = [f"{key} ({long[key]}, listed at {ALLOWED[key]})" for key in ALLOWED if long[key] > ALLOWED[key]]
    assert not grown, f"longer than the list allows: shorten them, never raise the figure: {grown}"


@pytest.mark.slow
def test_the_text_bound_misses_nothing_a_parse_finds() -> None:
    """Every file parsed: no function is longer than the text's bound said, and the same functions are long."""
    parsed: dict[str, int] = {}
    for relative, source in _sources():
        lengths = _parsed_lengths(relative, source)
        _defs, bound = longest_bound(source)
        assert max(lengths.values(), default=0) <= bound, f"{relative}: the text's bound {bound} is short"
        parsed.update({k: n for k, n in lengths.items() if n > MAX_LINES})
    assert parsed == long_functions()[1]


def test_the_bound_reads_strings_brackets_and_nesting() -> None:
    """A string, a bracket or a comment at the left edge inside a function does not end it early."""
    body = "".join(f"    x{i} = {i}\n" for i in range(40))
    source = (
        "@decorated\n"
        "def first():\n" + body
        + '    text = """\nnot code\ndef fake():\n"""\n'
        + "    call(\n1,\n)\n# a comment\n"
        + "    def inner():\n        return (\n  2)\n"
        + body + "\n\nclass After:\n    def short(self):\n        pass\n"
    )
    defs, bound = longest_bound(source)
    lengths = _parsed_lengths("x.py", source)
    assert defs == 3  # the def in the string is not one
    assert lengths["x.py:first"] > MAX_LINES and lengths["x.py:After.short"] == 2
    assert bound >= lengths["x.py:first"]
