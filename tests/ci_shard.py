"""CI's split of the model work between its two Python passes (LOGITLAB_SLOW_SHARD="k/n").

CI (.ci/run) runs the README's test command on the oldest and on the newest supported Python. The slow tier and
the fast tier's tests of the default model (marked `model`), most of the suite's time and all of it real models
doing the same numeric work on either Python, ran twice and took CI past its 45 minutes (74 on a slow day, 48 at
stop 55). So .ci/run tells each pass its share: each file's slow and model tests run in exactly one pass of every
CI run, chosen by its path (the same on both Pythons); the fast tier's other tests (cheap, and where a Python's own
changes show: asyncio, sqlite3, typing) and the tests marked `every_python` (their subject changes with the Python
itself) run in both. Without the variable, a user's run and any single-Python run, nothing is left out.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

SHARD_ENV = "LOGITLAB_SLOW_SHARD"

# The markers whose tests are split between the passes, and the one that keeps a test in every pass (torch.compile's
# dynamo reads each Python minor's own bytecode, so the compiled step can break on one Python and not another).
SPLIT_MARKERS = ("slow", "model")
EVERY_PYTHON_MARKER = "every_python"


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """("k/n") -> (k, n) with 0 <= k < n; None when unset or empty. Anything else is an error, said in words: a
    typo must not quietly run nothing or everything."""
    if not text:
        return None
    try:
        k_text, n_text = text.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise ValueError(f'{SHARD_ENV}={text!r}: expected "k/n", e.g. "0/2"') from None
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"{SHARD_ENV}={text!r}: needs 0 <= k < n")
    return k, n


def shard_of(relative_path: str, count: int, long_files: tuple[str, ...]) -> int:
    """The pass a file's split tests run in. The long files (longest first) are dealt out in turn, so each pass gets its
    share of the minute-long ones; the rest by a hash of their path, which both Pythons compute alike."""
    if relative_path in long_files:
        return long_files.index(relative_path) % count
    return zlib.crc32(relative_path.encode()) % count


def relative_test_path(item) -> str:
    path = Path(str(item.fspath)).as_posix()
    return path.split("/tests/", 1)[1] if "/tests/" in path else path


def is_split(item) -> bool:
    """Whether one pass runs this test for all of them."""
    if item.get_closest_marker(EVERY_PYTHON_MARKER) is not None:
        return False
    return any(item.get_closest_marker(name) is not None for name in SPLIT_MARKERS)


def deselect_other_shards(config, items, long_files: tuple[str, ...]) -> None:
    """Drop, in place, the tests that another pass runs (pytest's summary counts them as deselected)."""
    shard = parse_shard(os.environ.get(SHARD_ENV))
    if shard is None:
        return
    k, n = shard
    kept, dropped = [], []
    for item in items:
        elsewhere = is_split(item) and shard_of(relative_test_path(item), n, long_files) != k
        (dropped if elsewhere else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
