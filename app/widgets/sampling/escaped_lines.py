"""Lists of texts typed one per line, where \\n, \\t and \\\\ are escapes (a stop string may be a newline)."""

from __future__ import annotations

import codecs


def parse_lines(text: str) -> list[str]:
    """One text per line; \\n, \\t and \\\\ are escapes; empty lines are skipped."""
    out = []
    for line in text.splitlines():
        if line:
            try:
                out.append(codecs.decode(line, "unicode_escape") if "\\" in line else line)
            except UnicodeDecodeError:
                out.append(line)
    return [s for s in out if s]


def format_lines(items: tuple[str, ...] | list[str]) -> str:
    """The inverse of `parse_lines`: a text with a newline, tab or backslash is written with escapes."""
    return "\n".join(s.encode("unicode_escape").decode("ascii") if any(c in s for c in "\n\t\\") else s for s in items)
