"""Scan the machine for models: every known store and the user's folders, one entry per model.

Each location is read by its layout (a folder walk, Ollama's manifests, the
hub cache); each model's facts come from its GGUF header or config.json;
the memory estimate and the backend are added last. A file reachable by
several paths (LM Studio linked to a hub blob, a user folder inside
another) is listed once, under the first location that has it.

One bad file never stops the listing: every read is bounded (engine/library/
safe_read.py), a model whose files cannot be read is listed with the reason,
and anything unexpected while reading one model or one location is logged
and said on that entry, while the scan goes on with the next.
"""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.library.entry import Format, LibraryEntry, ModelFacts, Source, printable
from engine.library.facts_cache import FactsCache
from engine.library.gguf_facts import NOT_CHAT_MODELS, display_name, gguf_facts, is_later_part, is_projector, split_part
from engine.library.hf_cache import cached_models
from engine.library.hf_facts import folder_facts
from engine.library.locations import Location, default_locations
from engine.library.memory import MachineMemory, estimate_bytes, fit, machine_memory
from engine.library.ollama import ollama_models
from engine.library.walk import find_models

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScanResult:
    entries: tuple[LibraryEntry, ...]
    searched: tuple[Location, ...]  # the locations that exist here
    machine: MachineMemory
    seconds: float
    backends: dict[str, str] = field(default_factory=dict)  # format -> what "auto" runs it on here


def auto_backends() -> dict[str, str]:
    """What "auto" picks here for each format (select.py is the one place that knows backend names)."""
    from engine.backends.select import choose_backend

    return {"gguf": choose_backend("auto", "gguf"), "safetensors": choose_backend("auto", "folder")}


@dataclass
class _Scan:
    """One scan's working state (never kept on a long-lived object)."""

    cache: FactsCache
    machine: MachineMemory
    backends: dict[str, str]
    seen: set[str] = field(default_factory=set)
    entries: list[LibraryEntry] = field(default_factory=list)

    def claim(self, path: Path) -> str | None:
        """The real path of `path` if no earlier location listed it, else None."""
        real = os.path.realpath(path)
        if real in self.seen:
            return None
        self.seen.add(real)
        return real

    def add_gguf(self, source: Source, path: Path, name: str | None = None, spec: str | None = None,
                 problem: str = "") -> None:
        if is_later_part(path) or is_projector(path):
            return
        real = self.claim(path)
        if real is None:
            return
        facts = ModelFacts()
        if not problem:
            facts, problem = self._gguf_facts(real)
        if facts.architecture in NOT_CHAT_MODELS:
            return
        self._add(name or display_name(path), source, "gguf", path, spec or str(path), facts, problem)

    def add_folder(self, source: Source, path: Path, name: str, spec: str) -> None:
        if self.claim(path) is None:
            return
        facts, problem = folder_facts(path)
        self._add(name, source, "safetensors", path, spec, facts, problem)

    def add_unreadable(self, source: Source, fmt: Format, path: Path, name: str, spec: str, problem: str) -> None:
        """A model that failed in a way no reader expected: listed with the reason, never a failed scan."""
        self.claim(path)
        self._add(name, source, fmt, path, spec, ModelFacts(), problem)

    def _gguf_facts(self, real: str) -> tuple[ModelFacts, str]:
        try:
            st = os.stat(real)
        except OSError as e:
            return ModelFacts(), f"cannot read {real}: {e.strerror or e}"
        cached = self.cache.get(real, st)
        if cached is None:
            cached = gguf_facts(Path(real))
            self.cache.put(real, st, *cached)
        return cached

    def _add(self, name: str, source: Source, fmt: Format, path: Path, spec: str, facts: ModelFacts,
             problem: str) -> None:
        backend = self.backends.get(fmt, "")
        need = 0 if problem else estimate_bytes(facts, backend, self.machine.available_bytes)
        # Names and reasons come from file names and file contents: shown escaped (a name may hold
        # terminal escape sequences); path and spec stay as they are, to open the file.
        self.entries.append(LibraryEntry(
            name=printable(name), source=source, format=fmt, path=path, spec=spec, facts=facts, memory_bytes=need,
            fit=fit(need, self.machine) if not problem else "unknown", backend=backend, problem=printable(problem),
        ))


def _guarded(scan: _Scan, source: Source, fmt: Format, path: Path, name: str, spec: str, add: Callable[[], None]) -> None:
    """`add()` one model; an unexpected failure lists it as unreadable with the reason instead of ending the scan."""
    try:
        add()
    except Exception as e:  # noqa: BLE001 - one model's bad file must not cost the user the whole listing
        log.warning("model library: cannot read %s", path, exc_info=True)
        scan.add_unreadable(source, fmt, path, name, spec, f"cannot be read: {type(e).__name__}: {e}")


def lmstudio_name(root: Path, path: Path, single: bool) -> str:
    """LM Studio names a model publisher/repo (models/publisher/repo/file.gguf); the file's stem is added
    when the repo folder holds several models (quantizations)."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return path.stem
    if path.suffix.lower() != ".gguf":  # a model folder (MLX, safetensors): publisher/repo is the folder
        return "/".join(parts[-2:]) if len(parts) >= 2 else path.name
    if len(parts) < 3:
        return split_part(path)[0]
    repo = "/".join(parts[-3:-1])
    return repo if single else f"{repo}/{split_part(path)[0]}"


def _read_location(scan: _Scan, location: Location) -> None:
    source = location.source
    if location.layout == "ollama":
        for model in ollama_models(location.path):
            _guarded(scan, source, "gguf", model.blob, model.name, str(model.blob), partial(
                scan.add_gguf, "ollama", model.blob, name=model.name, spec=str(model.blob), problem=model.problem))
    elif location.layout == "huggingface":
        for cached in cached_models(location.path):
            if cached.kind == "gguf":
                _guarded(scan, "huggingface", "gguf", cached.path, split_part(cached.path)[0], cached.spec,
                         partial(scan.add_gguf, "huggingface", cached.path, spec=cached.spec))
            else:
                _guarded(scan, "huggingface", "safetensors", cached.path, cached.repo_id, cached.spec,
                         partial(scan.add_folder, "huggingface", cached.path, cached.repo_id, cached.spec))
    else:
        found_all = list(find_models(location.path))
        per_folder: dict[Path, int] = {}
        for found in found_all:  # models per folder: LM Studio's names say the file only where a repo has several
            if found.kind == "gguf" and not is_later_part(found.path) and not is_projector(found.path):
                per_folder[found.path.parent] = per_folder.get(found.path.parent, 0) + 1
        for found in found_all:
            if found.kind == "gguf":
                name = (lmstudio_name(location.path, found.path, per_folder.get(found.path.parent, 0) <= 1)
                        if source == "lmstudio" else display_name(found.path))
                _guarded(scan, source, "gguf", found.path, name, str(found.path),
                         partial(scan.add_gguf, source, found.path, name=name))
            else:
                name = lmstudio_name(location.path, found.path, True) if source == "lmstudio" else found.path.name
                _guarded(scan, source, "safetensors", found.path, name, str(found.path),
                         partial(scan.add_folder, source, found.path, name, str(found.path)))


def _default_cache() -> FactsCache:
    """The user cache's facts file; no cache (every header read again) when its folder cannot be made."""
    try:
        return FactsCache(FactsCache.default_path())
    except OSError as e:
        log.warning("the model library keeps no cache this time: %s", e)
        return FactsCache(None)


def scan(
    locations: Sequence[Location] | None = None,
    *,
    cache: FactsCache | None = None,
    machine: MachineMemory | None = None,
    backends: dict[str, str] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> ScanResult:
    """Find every model in `locations` (default: every known store on this machine).

    Args:
        locations: where to look; `default_locations()` when None.
        cache: remembered GGUF facts; the user cache's file when None.
        machine: the memory to compare against; this machine's when None.
        backends: format -> backend name; what "auto" picks here when None.
        cancelled: asked between locations; True stops the scan with what was found so far.
    """
    start = time.perf_counter()
    locations = default_locations() if locations is None else locations
    state = _Scan(
        cache=_default_cache() if cache is None else cache,
        machine=machine_memory() if machine is None else machine,
        backends=auto_backends() if backends is None else backends,
    )
    searched = []
    for location in locations:
        if cancelled():
            break
        try:
            if not location.path.exists():
                continue
        except (OSError, ValueError):  # a path the OS refuses to look at (too long, a NUL byte)
            continue
        searched.append(location)
        try:
            _read_location(state, location)
        except Exception:  # noqa: BLE001 - what this location gave so far stays; the other locations are read
            log.warning("model library: stopped reading %s", location.path, exc_info=True)
    state.cache.save(keep=state.seen)
    seconds = time.perf_counter() - start
    log.info("model library: %d models in %d locations, %.3f s", len(state.entries), len(searched), seconds)
    return ScanResult(tuple(state.entries), tuple(searched), state.machine, seconds, dict(state.backends))
