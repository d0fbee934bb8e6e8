"""Write a file whole or not at all: a temporary file in the same folder, then `os.replace`.

An export that fails halfway (a value that cannot be written, a full disk)
leaves no partial file behind, and an existing file of that name keeps its
old content until the new one is complete. The window's exports, the model
library's facts cache and the GGUF hash memo all write through here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_text_file(path: str | Path) -> Iterator[IO[str]]:
    """A text file to write; on a clean exit it becomes `path`, on an error it is removed."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        os.chmod(tmp, _mode_for(target))  # mkstemp makes it private; an export gets the usual permissions
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _mode_for(target: Path) -> int:
    try:
        return target.stat().st_mode & 0o777  # replacing a file keeps its permissions
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` (UTF-8) whole or not at all."""
    with atomic_text_file(path) as f:
        f.write(text)
