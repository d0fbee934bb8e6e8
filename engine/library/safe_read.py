"""Read the small files of other programs' stores without trusting them.

A model library scan reads files it did not write: Ollama manifests, Hugging
Face `config.json` and `refs/main`, safetensors headers. Any of them may be a
link to /dev/zero (an endless read), a FIFO (an open that blocks for good), a
huge file, or JSON nested thousands deep (a RecursionError). Here every read
is bounded in size and depth, only regular files are opened (checked before
the open with os.stat, and again on the open descriptor, opened with
O_NONBLOCK so a file swapped for a FIFO in between cannot block), and every
failure is one `Unreadable` exception whose text says why, for the listing
to show beside the entry.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from engine.json_depth import json_depth

MAX_JSON_DEPTH = 64  # real configs, manifests and safetensors headers nest 3-5 deep
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class Unreadable(Exception):
    """A file that cannot be used; `str()` says why in words (without the path: the caller names the entry)."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def is_regular_file(path: Path) -> bool:
    """True when `path` (links followed) is a regular file; never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: Path) -> int:
    """An O_RDONLY descriptor on `path`, only when it is a regular file (before and after the open)."""
    try:
        before = os.stat(path)
    except (OSError, ValueError) as e:
        raise Unreadable(f"cannot be read ({_why(e)})") from None
    if not stat.S_ISREG(before.st_mode):
        raise Unreadable(f"is {kind_of(before.st_mode)}, not a file")
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _BINARY)
    except (OSError, ValueError) as e:
        raise Unreadable(f"cannot be read ({_why(e)})") from None
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode):  # swapped between the stat and the open
            raise Unreadable(f"is {kind_of(after.st_mode)}, not a file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: Path, max_bytes: int, what: str = "file") -> bytes:
    """The whole of `path`, a regular file of at most `max_bytes`; Unreadable otherwise."""
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise Unreadable(f"cannot be read ({_why(e)})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise Unreadable(f"is larger than {max_bytes:,} bytes, too large to be a {what}")
    return data




def parse_json(raw: bytes, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`raw` as JSON, refused in words when it nests deeper than `max_depth` or is not JSON."""
    depth = json_depth(raw)
    if depth > max_depth:
        raise Unreadable(f"is JSON nested {depth:,} deep, where a real {what} nests a few levels (at most {max_depth} "
                         "are read)")
    try:
        return json.loads(raw)
    except RecursionError:  # belt and braces: the depth check above should have said so
        raise Unreadable(f"is JSON nested too deep for a {what}") from None
    except ValueError as e:  # includes UnicodeDecodeError
        raise Unreadable(f"is not valid JSON ({_first_line(str(e))[:120]})") from None


def read_json(path: Path, max_bytes: int, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A small JSON file of another program, bounded in size and depth; Unreadable with the reason otherwise."""
    return parse_json(read_bounded(path, max_bytes, what), what, max_depth)


def read_small_text(path: Path, max_bytes: int, what: str) -> str:
    """A short text file (a commit hash in refs/main), bounded; Unreadable otherwise."""
    data = read_bounded(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(f"is not text, so not a {what}") from None


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
