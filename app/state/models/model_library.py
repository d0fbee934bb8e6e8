"""The Model ▸ Library table's rows, Qt-free: the models found on this machine plus the recent ones.

A scan (`engine.library.scan`, run by the view off the UI thread) gives the
models on disk; the recent list (what was opened last, with its backend)
adds what a scan cannot see (hub ids, servers, the default model by name)
and puts recent models first. The folders the user adds are kept in the
store and searched by every scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from engine import library

from app.state.observable import Signal
from app.state.database.store import Store

FOLDERS_KEY = "library_folders"
RECENT_SOURCE = library.SOURCE_NAMES["recent"]  # a row found only because it was opened from elsewhere
DEFAULT_SPEC = "default"  # the recent list's name for the default model


@dataclass(frozen=True)
class LibraryRow:
    """One line of the table; `spec` and `backend` are what Open loads."""

    name: str
    source: str
    architecture: str
    parameters: str
    quantization: str
    size: str
    context: str
    memory: str
    backend: str  # what runs it: the backend it was opened with last, else what "auto" picks here
    spec: str
    path: str  # shown as a tooltip; "" for hub ids and servers
    problem: str = ""  # why it cannot be opened ("" when it can)
    recent: bool = False
    fit: str = "unknown"

    @property
    def openable(self) -> bool:
        return not self.problem

    def matches(self, query: str) -> bool:
        haystack = " ".join((self.name, self.source, self.architecture, self.quantization, self.spec, self.path,
                             self.backend)).lower()
        return all(word in haystack for word in query.lower().split())


def _parameters(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n) if n else ""


def row_for(entry: library.LibraryEntry, recent_backend: str | None = None) -> LibraryRow:
    f = entry.facts
    memory = f"{library.format_bytes(entry.memory_bytes)} · {entry.fit}" if entry.memory_bytes else ""
    return LibraryRow(
        name=entry.name, source=entry.source_name, architecture=f.architecture, parameters=_parameters(f.parameters),
        quantization=f.quantization, size=library.format_bytes(entry.file_bytes) if entry.file_bytes else "",
        context=f"{f.context_length:,}" if f.context_length else "", memory=memory,
        backend=recent_backend if recent_backend not in (None, "auto") else entry.backend,
        spec=entry.spec, path=library.printable(str(entry.path)), problem=entry.problem, recent=recent_backend is not None,
        fit=entry.fit,
    )


def _default_path() -> str:
    """The default model's file ("" when it is not installed): the recent list names it "default"."""
    from engine import EngineError, default_model_path

    try:
        return str(default_model_path())
    except EngineError:
        return ""


def _local_path(spec: str) -> Path | None:
    """The file or folder a recent spec names on this machine; None for hub ids, servers and what is gone."""
    if not spec or spec == DEFAULT_SPEC or spec.lower().startswith(("http://", "https://")):
        return None
    try:
        path = Path(spec).expanduser()
        return path if path.is_absolute() and path.exists() else None
    except (OSError, ValueError):
        return None


def _recent_only_row(spec: str, backend: str) -> LibraryRow:
    name = "Default model (SmolLM2-135M-Instruct)" if spec == DEFAULT_SPEC else spec
    source = "Server" if spec.lower().startswith(("http://", "https://")) else "Recent"
    return LibraryRow(name=name, source=source, architecture="", parameters="", quantization="", size="", context="",
                      memory="", backend=backend, spec=spec, path="", recent=True)


class ModelLibraryState:
    """The latest scan, the user's folders, and the rows a search shows."""

    def __init__(self, store: Store):
        self.store = store
        self.scan: library.ScanResult | None = None
        self.changed = Signal()  # () a scan arrived or the folders changed

    # -- folders ---------------------------------------------------------------------------------

    def folders(self) -> list[Path]:
        rows = self.store.get_setting(FOLDERS_KEY, [])
        return [Path(p) for p in rows if isinstance(p, str)]

    def add_folder(self, folder: Path) -> bool:
        """Remember `folder` for every scan; False when it was already there."""
        folder = Path(folder).expanduser()
        current = self.folders()
        if folder in current:
            return False
        self.store.put_setting(FOLDERS_KEY, [str(p) for p in [*current, folder]])
        self.changed.emit()
        return True

    def remove_folder(self, folder: Path) -> None:
        self.store.put_setting(FOLDERS_KEY, [str(p) for p in self.folders() if p != Path(folder)])
        self.changed.emit()

    def locations(self, recent: Sequence[dict[str, str]] = ()) -> list[library.Location]:
        """Where the next scan looks: every known store, the user's folders, then the recent models that are
        files or folders elsewhere (so their rows have facts too; one already found elsewhere is listed there)."""
        out = library.default_locations(extra_folders=self.folders())
        for item in recent:
            path = _local_path(item.get("spec", ""))
            if path is not None:
                out.append(library.Location("recent", path))
        return out

    # -- rows ------------------------------------------------------------------------------------

    def set_scan(self, result: library.ScanResult) -> None:
        self.scan = result
        self.changed.emit()

    def rows(self, recent: Sequence[dict[str, str]] = (), query: str = "") -> list[LibraryRow]:
        """Recent models first (in the order they were used), then the rest of the scan; filtered by `query`."""
        entries = list(self.scan.entries) if self.scan else []
        by_spec = {e.spec: e for e in entries}
        # A hub id opened recently is the hub cache's folder model of that repository (its spec is the snapshot's
        # path when refs/main names another commit).
        by_spec |= {e.name: e for e in entries if e.source == "huggingface" and e.format == "safetensors"
                    and e.name not in by_spec}
        by_path = {}
        for e in entries:
            try:
                by_path[e.path.resolve()] = e
            except (OSError, RuntimeError):
                continue
        out, used = [], set()
        for item in recent:
            spec, backend = item.get("spec", ""), item.get("backend", "auto")
            if not spec:
                continue
            entry = by_spec.get(spec) or self._by_path(by_path, _default_path() if spec == DEFAULT_SPEC else spec)
            if entry is not None and id(entry) not in used:
                used.add(id(entry))
                row = row_for(entry, backend)
                out.append(replace(row, spec=DEFAULT_SPEC) if spec == DEFAULT_SPEC else row)
            elif entry is None:
                out.append(_recent_only_row(spec, backend))
        out += [row_for(e) for e in entries if id(e) not in used]
        return [r for r in out if r.matches(query)] if query.strip() else out

    @staticmethod
    def _by_path(by_path: dict[Path, library.LibraryEntry], spec: str) -> library.LibraryEntry | None:
        if not spec or spec.lower().startswith(("http://", "https://")):
            return None
        try:
            return by_path.get(Path(spec).expanduser().resolve())
        except OSError:
            return None

    def summary(self, recent: Sequence[dict[str, str]] = (), query: str = "") -> str:
        """What the table lists, counted as it lists it: "3 models (2 found in 4 places, 1 opened recently) ·
        scanned in 40 ms · this machine: 32.0 GB memory, 20.1 GB available"; with a search, how many match."""
        if self.scan is None:
            return "Looking for models…"
        s = self.scan
        every = self.rows(recent)
        listed = len(every)
        only_recent = sum(1 for r in every if not r.path or r.source == RECENT_SOURCE)
        found = listed - only_recent
        places = len({loc.path for loc in s.searched if loc.source != "recent"})
        detail = f"{found} found in {places} place{'s' * (places != 1)}"
        if only_recent:
            detail += f", {only_recent} opened recently"
        head = f"{listed} model{'s' * (listed != 1)} ({detail})"
        if query.strip():
            shown = sum(1 for r in every if r.matches(query))
            head = f"{shown} of {head} match “{query.strip()}”"
        return (f"{head} · scanned in {s.seconds * 1000:.0f} ms · this machine: "
                f"{library.format_bytes(s.machine.total_bytes)} memory, {library.format_bytes(s.machine.available_bytes)} available")
