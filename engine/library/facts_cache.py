"""Remembered GGUF facts, so a second scan of the same files only stats them.

A header read costs milliseconds (a vocabulary is 50k-250k strings to step
over): a folder of a hundred models costs ~0.2 s to read (bench/library_scan.py)
and ~4 ms to stat. Facts are kept per file, keyed by its real path, size and
modification time: a replaced or re-downloaded file is read again.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

from engine.atomic_file import write_text_atomic
from engine.library.entry import ModelFacts
from engine.library.safe_read import Unreadable, read_json

log = logging.getLogger(__name__)

VERSION = 1
MAX_ROWS = 5000  # beyond this, rows for files the latest scan did not see are dropped
MAX_FILE_BYTES = 64 * 2**20  # ~300 bytes a row: far above MAX_ROWS rows


class FactsCache:
    """Load once, `get`/`put` during a scan, `save` at its end (written only when something changed)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._rows: dict[str, dict] = {}
        self._dirty = False
        if path is not None:
            try:
                data = read_json(path, MAX_FILE_BYTES, "facts cache")
                if isinstance(data, dict) and data.get("version") == VERSION and isinstance(data.get("files"), dict):
                    self._rows = data["files"]
            except Unreadable as e:  # missing or damaged: start empty, it is only a cache
                if path.exists():
                    log.warning("the model library's cache %s %s; starting it again", path, e)

    @staticmethod
    def default_path() -> Path:
        from engine.sources.cache_dir import cache_root

        return cache_root() / "library" / "gguf-facts.json"

    @staticmethod
    def _key(st: os.stat_result) -> list[int]:
        return [st.st_size, st.st_mtime_ns]

    def get(self, real_path: str, st: os.stat_result) -> tuple[ModelFacts, str] | None:
        row = self._rows.get(real_path)
        if not isinstance(row, dict) or row.get("key") != self._key(st):
            return None
        try:
            facts = ModelFacts(**row["facts"])
        except (TypeError, KeyError):
            return None
        if not all(isinstance(v, (int, str)) for v in vars(facts).values()):  # a damaged row: read the header again
            return None
        return facts, str(row.get("problem", ""))

    def put(self, real_path: str, st: os.stat_result, facts: ModelFacts, problem: str) -> None:
        self._rows[real_path] = {"key": self._key(st), "facts": asdict(facts), "problem": problem}
        self._dirty = True

    def save(self, keep: set[str] | None = None) -> None:
        """Write the cache; past MAX_ROWS, rows for files not in `keep` (this scan's) are dropped."""
        if self.path is None:
            return
        if keep is not None and len(self._rows) > MAX_ROWS:
            self._rows = {k: v for k, v in self._rows.items() if k in keep}
            self._dirty = True
        if not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps({"version": VERSION, "files": self._rows}))
            self._dirty = False
        except OSError as e:  # a read-only cache folder: scans still work, just slower next time
            log.warning("cannot save the model library's cache %s: %s", self.path, e)
