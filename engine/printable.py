"""Text from outside (file names, a server's model ids) made safe to print on a terminal or show in a window."""

from __future__ import annotations

import re

# Control characters (C0, DEL, C1) and the bidirectional overrides: text holding them would move the cursor,
# recolour or rewrite a terminal, or reverse the text shown around it; lone surrogates (bytes of a file name
# that are not UTF-8) would make printing fail.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with every control character escaped (ESC as \\x1b): safe to print on a terminal or show."""
    return _UNPRINTABLE.sub(lambda m: m[0].encode("unicode_escape", "backslashreplace").decode("ascii"), text)
