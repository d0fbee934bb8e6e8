"""What an answer's stored fields are: one definition for the loom import (strict) and the row reader (lenient).

An answer carries `request` (the options it was generated with), `model` (the
model that wrote it), `stats` (how the run went), `finish_reason` and
`branch_index`. The window reads them everywhere (`stats["decode_tokens_per_s"]`
formatted as a number, `model["name"]` shown as text, `request["reasoning"]`
read as a document), so a value of the wrong type — a list where a mapping
belongs, a text where a number belongs, NaN — must never get that far:

- a loom file with such a value is refused as a whole (app/state/loom_import.py);
- a database row holding one (written by an older version's import) reads with
  that field left out and a note saying why (`store.message_from_row`).

Each check returns the value (None for an absent one) or raises `FieldError`
with one line a user can read.
"""

from __future__ import annotations

import math
from typing import Any, Callable, TypeGuard

from app.state.steering_record import steering_record_problem

FINISH_REASONS = ("eos", "stop", "length", "cancelled", "error")
MAX_DEPTH = 32  # free-form documents (a request's settings, a model record) are a few levels deep
MAX_NODES = 200_000  # values in one free-form document
INT_LIMIT = 2**63  # what SQLite stores as an integer

# Fields of `stats` (GenerationStats.to_dict, less text and token ids, plus `interrupted_by`), by type.
STATS_INTS = ("prompt_tokens", "reused_tokens", "generated_tokens", "peak_memory_bytes", "seed")
STATS_FLOATS = ("time_to_first_token_s", "decode_tokens_per_s", "total_s")
STATS_TEXTS = ("finish_reason", "error", "constraint_status", "interrupted_by")
# Fields of `model` (app/state/model_record.MODEL_FIELDS), by type.
MODEL_INTS = ("parameters", "context_length")
MODEL_TEXTS = ("name", "spec", "architecture", "dtype", "backend", "device", "revision")
# Fields of `request` (GenerationOptions.to_dict and what the chat, the loom and replays add), by type.
REQUEST_DOCS = ("sampler", "constraint", "reasoning", "loom")
REQUEST_INTS = ("max_new_tokens", "top_n")


class FieldError(ValueError):
    """A stored or imported field is not what an answer's field is."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def is_int(value: Any) -> TypeGuard[int]:
    """An integer (not true/false) that fits a database integer."""
    return isinstance(value, int) and not isinstance(value, bool) and -INT_LIMIT <= value < INT_LIMIT


def is_number(value: Any) -> TypeGuard[int | float]:
    """A finite number (not true/false)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_json(value: Any, name: str, *, allow_minus_inf: bool = True) -> Any:
    """`value` if it is plain JSON (mappings with text keys, lists, texts, integers, finite numbers, true/false,
    null) at most `MAX_DEPTH` deep; -inf is allowed where it means a ban or an impossible token. Walked without
    recursion, so a document nested thousands deep is refused rather than overflowing the stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise FieldError(f"{name} holds more than {MAX_NODES:,} values")
        if depth > MAX_DEPTH:
            raise FieldError(f"{name} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    raise FieldError(f"{name} has a key that is not a text ({k!r})")
                stack.append((item, depth + 1))
        elif isinstance(v, list):
            stack.extend((item, depth + 1) for item in v)
        elif isinstance(v, float):
            if math.isnan(v) or (v == math.inf) or (v == -math.inf and not allow_minus_inf):
                raise FieldError(f"{name} holds {v} (a number that is not finite)")
        elif isinstance(v, int) and not isinstance(v, bool):
            if not is_int(v):
                raise FieldError(f"{name} holds the integer {v}, too large to store")
        elif v is not None and not isinstance(v, (str, bool)):
            raise FieldError(f"{name} holds {_kind(v)}, which JSON does not have")
    return value


def _mapping(value: Any, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FieldError(f"its {name} is {_kind(value)}, not a mapping")
    check_json(value, f"its {name}")
    return value


def _typed(doc: dict[str, Any], name: str, keys: tuple[str, ...], ok: Callable[[Any], bool], what: str) -> None:
    for key in keys:
        if key in doc and doc[key] is not None and not ok(doc[key]):
            raise FieldError(f"its {name} field {key!r} is {_kind(doc[key])}, not {what}")


def check_request(value: Any) -> dict[str, Any] | None:
    """The options an answer was generated with: a mapping whose known fields have their types."""
    doc = _mapping(value, "request")
    if doc is not None:
        _typed(doc, "request", REQUEST_DOCS, lambda v: isinstance(v, dict), "a mapping")
        _typed(doc, "request", REQUEST_INTS, is_int, "an integer")
        _typed(doc, "request", ("server_sampling",), lambda v: isinstance(v, (bool, str)), "true/false")
        stop = doc.get("stop")
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise FieldError(f"its request field 'stop' is {_kind(stop)}, not a list of texts")
        problem = steering_record_problem(doc["steering"]) if doc.get("steering") is not None else None
        if problem:  # control vectors by name and hash, strengths, layer range (app/state/steering_record.py)
            raise FieldError(problem)
    return doc


def check_model(value: Any) -> dict[str, Any] | None:
    """The model that wrote an answer: a mapping whose name, spec, backend... are texts."""
    doc = _mapping(value, "model")
    if doc is not None:
        _typed(doc, "model", MODEL_TEXTS, lambda v: isinstance(v, str), "a text")
        _typed(doc, "model", MODEL_INTS, is_int, "an integer")
    return doc


def check_stats(value: Any) -> dict[str, Any] | None:
    """How an answer's run went: a mapping whose counts are integers and times finite numbers."""
    doc = _mapping(value, "stats")
    if doc is not None:
        _typed(doc, "stats", STATS_INTS, is_int, "an integer")
        _typed(doc, "stats", STATS_FLOATS, is_number, "a finite number")
        _typed(doc, "stats", STATS_TEXTS, lambda v: isinstance(v, str), "a text")
        lp = doc.get("constraint_logprob")  # log of the mass a constraint kept: -inf at a dead end
        if lp is not None and not (is_number(lp) or lp == -math.inf):
            raise FieldError(f"its stats field 'constraint_logprob' is {_kind(lp)}, not a log-probability")
        problem = fingerprint_problem(doc)
        if problem:
            raise FieldError(f"its stats field 'fingerprint' is wrong: {problem}")
    return doc


def fingerprint_problem(stats: dict[str, Any]) -> str | None:
    """What is wrong with `stats["fingerprint"]` (engine.fingerprints.record: what the answer's numbers depend on);
    None when it is absent (an answer from before fingerprints) or right."""
    from engine import Fingerprint

    fp = stats.get("fingerprint")
    if fp is None:
        return None
    try:
        Fingerprint.from_dict(fp)
    except ValueError as e:
        return str(e)
    return None


def check_finish_reason(value: Any) -> str | None:
    """How an answer ended: one of `FINISH_REASONS`, or None (interrupted, or still generating)."""
    if value is not None and value not in FINISH_REASONS:
        shown = repr(value) if isinstance(value, str) and len(value) <= 40 else _kind(value)
        raise FieldError(f"its finish reason is {shown}, not one of {', '.join(FINISH_REASONS)}")
    return value


def check_branch_index(value: Any, tokens: int | None = None) -> int | None:
    """Where a branch forced its token: a token index (at most `tokens`, when known), or None."""
    if value is None:
        return None
    if not is_int(value) or value < 0:
        raise FieldError(f"its branch index is {value!r}, not a token index" if is_number(value)
                         else f"its branch index is {_kind(value)}, not a token index")
    if tokens is not None and value > tokens:
        raise FieldError(f"its branch index {value} lies past its {tokens} tokens")
    return value


# Each takes a stored value and returns it checked (check_branch_index's token count is optional).
ANSWER_CHECKS: dict[str, Callable[[Any], Any]] = {
    "request": check_request,
    "model": check_model,
    "stats": check_stats,
    "finish_reason": check_finish_reason,
    "branch_index": check_branch_index,
}


def readable_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`fields` (some of `ANSWER_CHECKS`' names) with each unreadable value replaced by None, and a note
    naming what was left out and why (None when everything was readable)."""
    out, problems = dict(fields), []
    stats = fields.get("stats")
    if isinstance(stats, dict) and fingerprint_problem(stats):  # only the fingerprint is left out, not the seed
        problems.append(f"stats field 'fingerprint' is wrong: {fingerprint_problem(stats)}")
        fields = {**fields, "stats": {k: v for k, v in stats.items() if k != "fingerprint"}}
        out = dict(fields)
    for name, value in fields.items():
        try:
            out[name] = ANSWER_CHECKS[name](value)
        except FieldError as e:
            out[name] = None
            problems.append(str(e).removeprefix("its "))
    return out, ("; ".join(problems) or None)
