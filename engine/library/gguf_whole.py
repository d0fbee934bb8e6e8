"""Is a downloaded GGUF whole? Its own header says how long it must be; checked before the file gets its name.

A server can state a wrong length (a Content-Length half the real one, with
nothing else to contradict it) or serve a file that is itself cut short, and
a checksum published for those same short bytes matches them. The header
cannot lie that way: its tensor records give every tensor's offset and type,
so the end of the last tensor's data is where the file must at least reach
(engine.backends.llamacpp.gguf_header computes it, the check `models` makes
later). A file that does not start with the GGUF magic is not judged here:
what it is, the library says when it lists it.
"""

from __future__ import annotations

from pathlib import Path

from engine.backends.llamacpp.gguf_header import MAGIC, read_header
from engine.errors import ModelLoadError


def is_gguf_name(name: str) -> bool:
    return name.lower().endswith(".gguf")


def gguf_shortfall(path: Path) -> str:
    """"" when `path` reaches as far as its GGUF header says (or is no GGUF at all); else the header check's
    sentence saying how far short it is ("its tensors need N bytes but the file has M")."""
    try:
        with Path(path).open("rb") as f:
            if f.read(4) != MAGIC:
                return ""
    except OSError:
        return ""
    try:
        read_header(Path(path))
    except ModelLoadError as e:
        text = str(e)
        if "truncated" not in text:
            return ""
        # The reader names the file it read (a .part here) and guesses why; the caller says both better.
        return text.removeprefix(f"{path} is truncated: ").removesuffix(" (an interrupted download?)")
    return ""
