"""Find model files under a folder: fast, bounded, and safe from symlink loops.

A folder is entered at most once, by its (device, inode) identity, so a link
back to a parent (or two links to each other) ends the descent instead of
looping; depth is bounded too, for a user who adds their whole home folder.
Hidden folders (LM Studio's `.internal`, `.git`) are not entered.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

MAX_DEPTH = 6  # LM Studio: models/publisher/repo/file.gguf is 3 deep
MAX_ENTRIES = 200_000  # directory entries looked at per root before giving up (a huge tree added by mistake)


@dataclass(frozen=True)
class Found:
    kind: Literal["gguf", "folder"]  # a .gguf file, or a Hugging Face model folder (config.json + safetensors)
    path: Path


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()  # follows a link to a file: LM Studio and llama.cpp users link models in
    except OSError:
        return False


def find_models(root: Path, max_depth: int = MAX_DEPTH) -> Iterator[Found]:
    """Yield the .gguf files and model folders under `root` (root itself may be either)."""
    root = Path(root)
    if root.is_file():
        if root.suffix.lower() == ".gguf":
            yield Found("gguf", root)
        return
    seen: set[tuple[int, int]] = set()
    budget = [MAX_ENTRIES]
    yield from _walk(root, 0, max_depth, seen, budget)


def _walk(folder: Path, depth: int, max_depth: int, seen: set[tuple[int, int]], budget: list[int]) -> Iterator[Found]:
    try:
        st = folder.stat()  # follows links: the identity of what we would read
    except OSError:
        return
    identity = (st.st_dev, st.st_ino)
    if identity in seen:
        log.debug("not entering %s again (a link loop or a second link to it)", folder)
        return
    seen.add(identity)
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError as e:  # permission denied, vanished meanwhile
        log.debug("cannot list %s: %s", folder, e)
        return
    budget[0] -= len(entries)
    if budget[0] < 0:
        log.warning("stopped looking in %s: too many files under it", folder)
        return
    names = {e.name for e in entries}
    if "config.json" in names and any(n.endswith(".safetensors") for n in names):
        yield Found("folder", folder)
    subfolders = []
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.name.lower().endswith(".gguf") and _is_file(entry):
            yield Found("gguf", Path(entry.path))
        elif not entry.name.startswith(".") and depth < max_depth:
            try:
                if entry.is_dir():
                    subfolders.append(Path(entry.path))
            except OSError:
                continue
    for sub in subfolders:
        yield from _walk(sub, depth + 1, max_depth, seen, budget)
