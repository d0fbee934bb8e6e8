"""Free space for a download: checked before writing and again while writing.

Writing until the disk is full would leave the user's disk full (and other
programs failing) before we say anything; checking first, with a reserve
left free, says it in words up front. The check repeats while writing,
because other programs write too, and a write that still fails with ENOSPC
becomes the same error.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.library.errors import DiskFullError
from engine.library.progress import format_bytes

RESERVE_BYTES = 256 * 2**20  # left free for the system and other programs
FreeSpaceFn = Callable[[Path], int]


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk holding `folder` (its nearest existing parent)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_space(folder: Path, more_bytes: int, free_space: FreeSpaceFn = free_bytes, reserve: int = RESERVE_BYTES,
                what: str = "the download") -> None:
    """DiskFullError unless `more_bytes` fit in `folder` with `reserve` left over."""
    free = free_space(folder)
    if more_bytes + reserve > free:
        raise DiskFullError(
            f"not enough free space for {what} in {folder}: it needs {format_bytes(more_bytes)} more and "
            f"{format_bytes(free)} are free (keeping {format_bytes(reserve)} spare); free some space and try again, "
            "the part already received is kept"
        )


def is_disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(folder: Path, what: str) -> DiskFullError:
    return DiskFullError(
        f"the disk holding {folder} is full: {what} stopped; free some space and try again, "
        "the part already received is kept"
    )
