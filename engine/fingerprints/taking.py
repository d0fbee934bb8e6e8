"""Taking an answer's fingerprint (engine/fingerprints/record.py holds the value): from the backend that made it and the
request, attached to the answer's last event on the way out of the worker, or to each of the loom's rows.

The model file's SHA-256 is read once per file (memoised by path, size and modification time).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.capabilities import NumericFacts
from engine.events import Done, Event
from engine.fingerprints.record import _NOT_NUMERIC, _WEIGHT_SUFFIXES, Fingerprint, NumericSetup, _canonical

if TYPE_CHECKING:
    from engine.backend import Backend
    from engine.request import GenerationRequest

log = logging.getLogger(__name__)

_hash_lock = threading.Lock()
_hashes: dict[tuple[str, int, int], str] = {}


def model_sha256(path: str) -> str:
    """SHA-256 of the model's weights: a file's own, or for a folder the hash of its weight files' hashes
    (name and digest, sorted). "" when `path` is not on this machine (a server model)."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return ""
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES))
    if not files:
        return ""
    digests = [(f.name, _file_sha256(f)) for f in files]
    if p.is_file():
        return digests[0][1]
    return hashlib.sha256("\n".join(f"{n} {d}" for n, d in digests).encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    from engine.sources.gguf_convert import file_sha256  # the memo on disk (by path, size and mtime)

    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _hash_lock:
        if key not in _hashes:
            _hashes[key] = file_sha256(path)
        return _hashes[key]


def _record(value: Any) -> Any:
    """A request field's record: its own `to_dict()` when it has one, else its text."""
    to_dict = getattr(value, "to_dict", None)
    return _canonical(to_dict()) if callable(to_dict) else repr(value)


def sampler_record(settings: Any) -> dict[str, Any]:
    """The sampler settings as saved; a custom stage (Python code) is kept by name only."""
    custom = [c.name for c in settings.custom_stages]
    d = settings.without_custom_stages().to_dict() if custom else settings.to_dict()
    if custom:
        d["custom_stages"] = custom
    return _canonical(d)


def fingerprint_for(backend: "Backend", request: "GenerationRequest", seed: int, stats: Any = None) -> Fingerprint:
    """The fingerprint of an answer `backend` just made for `request` with `seed`; `stats` (its GenerationStats)
    gives which prompt it continued and how that prompt's cache was computed."""
    info = backend.info
    setup = backend.numeric_facts() if isinstance(backend, NumericFacts) else NumericSetup()
    extras = {}
    for f in fields(request):
        value = getattr(request, f.name)
        # None, False, nothing (no tools), or a value that says it changes nothing (an inactive steering: no vector,
        # or strength 0; a tool choice without tools)
        if (f.name in _NOT_NUMERIC or value is None or value is False or value == ()
                or getattr(value, "active", True) is False or (f.name == "tool_choice" and not request.tools)):
            continue
        extras[f.name] = _record(value)
    return Fingerprint(
        model_name=info.name,
        model_sha256=model_sha256(info.path) if info.runs_locally else "",
        model_revision=info.revision,
        backend=info.backend,
        device=setup.device or info.device,
        libraries=setup.libraries,
        numerics=setup.settings,
        seed=int(seed),
        sampler=sampler_record(request.sampler.with_(seed=int(seed))),
        extras=extras,
        prompt_sha256=getattr(stats, "prompt_sha256", ""),
        cache_schedule=tuple(getattr(stats, "cache_schedule", ())),
    )


def with_fingerprint(backend: "Backend", request: "GenerationRequest", events: Iterable[Event]) -> Iterator[Event]:
    """`events` with the final Done's stats carrying the answer's fingerprint (a failure to make one is
    logged and leaves it out: the answer matters more than its record)."""
    for event in events:
        if isinstance(event, Done) and event.stats.fingerprint is None:
            try:
                fp = fingerprint_for(backend, request, event.stats.seed, event.stats)
                event = Done(replace(event.stats, fingerprint=fp))
            except Exception:  # noqa: BLE001 - never lose an answer over its fingerprint
                log.warning("could not make the answer's fingerprint", exc_info=True)
        yield event


def rows_with_fingerprint(backend: "Backend", request: "GenerationRequest", n: int, row_events: Iterable[Any]
                          ) -> Iterator[Any]:
    """The loom's `RowEvent`s with each row's Done carrying its fingerprint, marked as one of `n` rows
    (`extras["loom_rows"]`: it was decoded with its siblings, where a backend may round otherwise)."""
    for ev in row_events:
        yield row_with_fingerprint(backend, request, ev, {"loom_rows": n})


def row_with_fingerprint(backend: "Backend", request: "GenerationRequest", ev: Any, extras: dict[str, Any]) -> Any:
    """A `RowEvent` whose Done carries its fingerprint with `extras` added (how the row was batched); other
    events as they are."""
    stats = ev.event.stats if isinstance(ev.event, Done) else None
    if stats is None or stats.fingerprint is not None:
        return ev
    try:
        fp = fingerprint_for(backend, request, stats.seed, stats)
        fp = replace(fp, extras={**fp.extras, **extras})
        return replace(ev, event=Done(replace(stats, fingerprint=fp)))
    except Exception:  # noqa: BLE001 - never lose a row over its fingerprint
        log.warning("could not make a batch row's fingerprint", exc_info=True)
        return ev
