"""What an answer's numbers depend on, recorded with the answer: its fingerprint.

Two runs with the same fingerprint and the same prompt should give the same tokens and
the same log-probs bit for bit; when a replay does not, the fields that differ
(`Fingerprint.changes`) are where to look first: "n_threads 2 -> 4" (a matmul summed in
another order), "llama-cpp-python 0.3.36 -> 0.3.40", "model_sha256 ab12... -> cd34...".

A backend states what it computes with through the `NumericFacts` capability
(engine/capabilities.py): its libraries' versions and the settings that change the
arithmetic (threads, batch sizes, flash attention, dtype). The model file's hash comes
from the file itself (memoised by size and modification time, so it is read once).
Everything is asked when the answer ends, because some facts (llama.cpp's threads) are
chosen per answer: engine/fingerprints/taking.py takes it and attaches it; this module is
only the value (it imports nothing of the engine, so events and capabilities can name it).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

log = logging.getLogger(__name__)

Scalar = str | int | float | bool | None
# Request fields that say what to continue, when to stop or what to report, not how a token is computed.
_NOT_NUMERIC = frozenset({"prompt", "messages", "prompt_ids", "sampler", "max_new_tokens", "stop", "top_n",
                          "record_stages", "assistant_prefix", "forced_tokens", "ignore_eos", "cache_schedule"})
_WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".npz", ".pt", ".pth")
MAX_TEXT = 4096  # a fingerprint's longest text (a value read from a file is refused past it)


def token_ids_sha256(ids: Iterable[int]) -> str:
    """SHA-256 of token ids (each as 4 little-endian bytes): which prompt an answer continued, without the prompt."""
    import hashlib
    import struct

    ids = list(ids)
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


def library_version(distribution: str) -> str:
    """The installed version of a Python distribution ("" when it is not installed)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


@dataclass(frozen=True)
class NumericSetup:
    """What a backend computes with, as far as the numbers go (the `NumericFacts` capability's answer).

    Attributes:
        libraries: (distribution, version) of each library that computes, e.g. ("llama-cpp-python", "0.3.36").
        device: where it computes, without the per-answer details (threads are a setting).
        settings: (name, value) of each setting that can change the numbers, e.g. ("n_threads", 2).
    """

    libraries: tuple[tuple[str, str], ...] = ()
    settings: tuple[tuple[str, Scalar], ...] = ()
    device: str = ""  # where it computes, plainly ("cpu", "cuda:0"); "": ModelInfo.device says

    @classmethod
    def of(cls, distributions: Iterable[str | tuple[str, str]], device: str = "", **settings: Scalar) -> "NumericSetup":
        """The installed versions of `distributions` and `settings` in the order given. A (distribution,
        version) pair gives the version a library reports itself where that says more than its
        distribution's: torch's `__version__` names its build ("2.13.0+cu130"), PyPI's metadata does not."""
        libraries = tuple(d if isinstance(d, tuple) else (d, library_version(d)) for d in distributions)
        return cls(libraries, tuple(settings.items()), device)


@dataclass(frozen=True)
class Fingerprint:
    """Everything an answer's tokens and log-probs depend on besides its prompt.

    `sampler` is the sampler settings as saved (`SamplerSettings.to_dict`, the run's seed in it),
    `extras` any other request field that changes the tokens (a constraint, steering), each as
    its record. A field that is unknown is "" (a server model has no file hash here).
    """

    model_name: str
    model_sha256: str
    model_revision: str
    backend: str
    device: str
    libraries: tuple[tuple[str, str], ...]
    numerics: tuple[tuple[str, Scalar], ...]
    seed: int
    sampler: Mapping[str, Any] = field(default_factory=dict)
    extras: Mapping[str, Any] = field(default_factory=dict)
    # The token ids the answer continued (token_ids_sha256; "" on older records), and the forward calls its prompt's
    # cache was computed in (engine/cache_schedule.py's run-length record; () where the backend does not say).
    # Both are compared only when both runs recorded them.
    prompt_sha256: str = ""
    cache_schedule: tuple[tuple[int, int, int], ...] = ()

    def flat(self) -> dict[str, Any]:
        """Every compared value under one name: plain fields, each library, numeric setting and sampler field."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                               if f.name not in ("libraries", "numerics", "sampler", "extras", *_IF_RECORDED)}
        out.update((name, version) for name, version in self.libraries)
        out.update(self.numerics)
        out.update((f"sampler.{k}", _canonical(v)) for k, v in self.sampler.items())
        out.update((k, _canonical(v)) for k, v in self.extras.items())
        out.update((k, _canonical(getattr(self, k))) for k in _IF_RECORDED if getattr(self, k))
        return out

    def diff(self, other: "Fingerprint") -> list[str]:
        """The names (as in `flat`) whose values differ between the two, in this fingerprint's order."""
        a, b = self.flat(), other.flat()
        return [k for k in (*a, *(k for k in b if k not in a)) if a.get(k, _ABSENT) != b.get(k, _ABSENT)
                and not (k in _IF_RECORDED and (k not in a or k not in b))]

    def changes(self, other: "Fingerprint") -> list[str]:
        """`diff` in words: "n_threads 2 -> 4", "llama-cpp-python 0.3.36 -> 0.3.40" (this -> other)."""
        a, b = self.flat(), other.flat()
        return [_change_text(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in self.diff(other)]

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["libraries"] = [list(p) for p in self.libraries]
        d["numerics"] = [list(p) for p in self.numerics]
        d["sampler"], d["extras"] = dict(self.sampler), dict(self.extras)
        d["cache_schedule"] = [list(run) for run in self.cache_schedule]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "Fingerprint":
        """A fingerprint read from a file or the database; ValueError saying what is wrong with it."""
        return check_fingerprint_dict(d)

    def summary(self) -> str:
        """One line for people: model, hash, backend and versions, device, the numeric settings, seed."""
        libs = ", ".join(f"{n} {v}" for n, v in self.libraries if v)
        nums = ", ".join(f"{n}={_shown(v)}" for n, v in self.numerics)
        sha = self.model_sha256[:12] or "unknown"
        return (f"{self.model_name} (sha256 {sha}); {self.backend} [{libs}] on {self.device}; "
                f"{nums}{'; ' if nums else ''}seed {self.seed}")


_ABSENT = object()
_IF_RECORDED = ("prompt_sha256", "cache_schedule")  # compared only when both runs have them


def _change_text(name: str, a: Any, b: Any) -> str:
    """One difference in words; the prompt and its cache's pieces said as what they mean."""
    if name == "prompt_sha256":
        return "prompt: other tokens (the text before the answer is not what it was)"
    if name == "cache_schedule":
        from engine.cache_schedule import describe

        return f"prompt cache computed in other pieces ({describe(a)} tokens per call -> {describe(b)})"
    if name in ("loom_rows", "batch_rows"):  # how the answer was batched: the kernels differ with a batch's size
        def rows(v: Any) -> str:
            return "alone" if v is _ABSENT else f"as one of {v} rows of a batch"
        return f"decoded {rows(a)} -> {rows(b)}"
    return f"{name} {_shown(a)} -> {_shown(b)}"


def _canonical(v: Any) -> Any:
    """A JSON-like value in one spelling (tuples as lists), so a value read back compares equal."""
    return json.loads(json.dumps(v, sort_keys=True, default=str))


def _shown(v: Any) -> str:
    if v is _ABSENT:
        return "(none)"
    if isinstance(v, str):
        return v[:16] + "…" if len(v) == 64 and all(c in "0123456789abcdef" for c in v) else repr(v) if not v else v
    return json.dumps(v, default=str) if not isinstance(v, (int, float, bool)) or isinstance(v, bool) else str(v)


def check_fingerprint_dict(d: Any) -> Fingerprint:
    """`d` (JSON) as a Fingerprint, every field checked; ValueError naming the first field that is wrong."""
    if not isinstance(d, dict):
        raise ValueError(f"a fingerprint is a mapping, got {type(d).__name__}")
    texts = ("model_name", "model_sha256", "model_revision", "backend", "device")
    for name in texts:
        v = d.get(name, "")
        if not isinstance(v, str) or len(v) > MAX_TEXT:
            raise ValueError(f"fingerprint field {name!r} must be a text (at most {MAX_TEXT} characters), got {_what(v)}")
    sha = d.get("model_sha256", "")
    if sha and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        raise ValueError("fingerprint field 'model_sha256' must be 64 lowercase hex digits (or empty)")
    seed = d.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"fingerprint field 'seed' must be a whole number from 0 to 2**64-1, got {_what(seed)}")
    libraries = _pairs(d.get("libraries", []), "libraries", lambda v: isinstance(v, str) and len(v) <= MAX_TEXT)
    numerics = _pairs(d.get("numerics", []), "numerics", _is_scalar)
    for name in ("sampler", "extras"):
        v = d.get(name, {})
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise ValueError(f"fingerprint field {name!r} must be a mapping with text keys, got {_what(v)}")
    prompt_sha = d.get("prompt_sha256", "")
    if prompt_sha and not _is_sha256(prompt_sha):
        raise ValueError("fingerprint field 'prompt_sha256' must be 64 lowercase hex digits (or empty)")
    try:
        from engine.cache_schedule import check_record

        schedule = check_record(d.get("cache_schedule", []))
    except ValueError as e:
        raise ValueError(f"fingerprint field 'cache_schedule': {e}") from None
    unknown = sorted(set(d) - {f.name for f in fields(Fingerprint)})
    if unknown:
        raise ValueError(f"fingerprint has unknown field(s) {', '.join(map(repr, unknown[:5]))}")
    text = {n: str(d.get(n, "")) for n in texts}
    return Fingerprint(model_name=text["model_name"], model_sha256=text["model_sha256"],
                       model_revision=text["model_revision"], backend=text["backend"], device=text["device"],
                       libraries=libraries, numerics=numerics, seed=seed,
                       sampler=dict(d.get("sampler", {})), extras=dict(d.get("extras", {})),
                       prompt_sha256=prompt_sha, cache_schedule=schedule)


def _is_sha256(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _is_scalar(v: Any) -> bool:
    if isinstance(v, float):
        return v == v and abs(v) != float("inf")
    return v is None or isinstance(v, (bool, int)) or (isinstance(v, str) and len(v) <= MAX_TEXT)


def _pairs(value: Any, name: str, ok: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(value, (list, tuple)) or len(value) > 256:
        raise ValueError(f"fingerprint field {name!r} must be a list of [name, value] pairs, got {_what(value)}")
    out = []
    for pair in value:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)
                and 0 < len(pair[0]) <= 200 and ok(pair[1])):
            raise ValueError(f"fingerprint field {name!r} holds {_what(pair)}, not a [name, value] pair")
        out.append((pair[0], pair[1]))
    return tuple(out)


def _what(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else f"{type(v).__name__} ({len(text)} characters)"


# ---------------------------------------------------------------------------------------------- building one
