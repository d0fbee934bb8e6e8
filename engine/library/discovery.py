"""Scan the machine for models: every known store and the user's folders, one entry per model.

Each location is read by its layout (a folder walk, Ollama's manifests, the
hub cache); each model's facts come from its GGUF header or config.json;
the memory estimate and the backend are added last. A file reachable by
several paths (LM Studio linked to a hub blob, a user folder inside
another) is listed once, under the first location that has it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.library.entry import Format, LibraryEntry, ModelFacts, Source
from engine.library.facts_cache import FactsCache
from engine.library.gguf_facts import NOT_CHAT_MODELS, gguf_facts, is_later_part, is_projector, split_part
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
        self._add(name or split_part(path)[0], source, "gguf", path, spec or str(path), facts, problem)

    def add_folder(self, source: Source, path: Path, name: str, spec: str) -> None:
        if self.claim(path) is None:
            return
        facts, problem = folder_facts(path)
        self._add(name, source, "safetensors", path, spec, facts, problem)

    def _gguf_facts(self, real: str) -> tuple[ModelFacts, str]:
        try:
            st = os.stat(real)
        except OSError as e:
            return ModelFacts(), f"cannot read {real}: {e}"
        cached = self.cache.get(real, st)
        if cached is None:
            cached = gguf_facts(Path(real))
            self.cache.put(real, st, *cached)
        return cached

    def _add(self, name: str, source: Source, fmt: Format, path: Path, spec: str, facts: ModelFacts,
             problem: str) -> None:
        backend = self.backends.get(fmt, "")
        need = 0 if problem else estimate_bytes(facts, backend, self.machine.available_bytes)
        self.entries.append(LibraryEntry(
            name=name, source=source, format=fmt, path=path, spec=spec, facts=facts, memory_bytes=need,
            fit=fit(need, self.machine) if not problem else "unknown", backend=backend, problem=problem,
        ))


def _read_location(scan: _Scan, location: Location) -> None:
    if location.layout == "ollama":
        for model in ollama_models(location.path):
            scan.add_gguf("ollama", model.blob, name=model.name, spec=str(model.blob), problem=model.problem)
    elif location.layout == "huggingface":
        for model in cached_models(location.path):
            if model.kind == "gguf":
                scan.add_gguf("huggingface", model.path, spec=model.spec)
            else:
                scan.add_folder("huggingface", model.path, model.repo_id, model.spec)
    else:
        for found in find_models(location.path):
            if found.kind == "gguf":
                scan.add_gguf(location.source, found.path)
            else:
                scan.add_folder(location.source, found.path, found.path.name, str(found.path))


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
        cache=FactsCache(FactsCache.default_path()) if cache is None else cache,
        machine=machine_memory() if machine is None else machine,
        backends=auto_backends() if backends is None else backends,
    )
    searched = []
    for location in locations:
        if cancelled():
            break
        if not location.path.exists():
            continue
        searched.append(location)
        _read_location(state, location)
    state.cache.save(keep=state.seen)
    seconds = time.perf_counter() - start
    log.info("model library: %d models in %d locations, %.3f s", len(state.entries), len(searched), seconds)
    return ScanResult(tuple(state.entries), tuple(searched), state.machine, seconds, dict(state.backends))
