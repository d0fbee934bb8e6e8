"""Token records: the engine's `TokenEvent`, stored compactly and rebuilt exactly.

The app keeps the engine's own frozen `TokenEvent` as its token record (one
type from the decode loop to the inspector). On disk the scalar fields get
columns and the alternatives one compact JSON array, `[id, text, logprob]`
per candidate, so a 4,000-token answer with stage snapshots stays a few MB.
"""

from __future__ import annotations

import json
import math
from typing import Any

from engine import ConstraintStep, Rewind, StageSnapshot, TokenEvent, TokenProb

_Row = tuple[int, str, float | None] | tuple[int, str, float | None, str]


def _logprob_out(lp: float) -> float | None:
    # -inf (a forced token the sampler had filtered out) has no JSON spelling.
    return lp if math.isfinite(lp) else None


def _logprob_in(lp: float | None) -> float:
    return -math.inf if lp is None else float(lp)


def _probs_out(probs: tuple[TokenProb, ...]) -> list[_Row]:
    # A fourth element, the bytes in hex, only for tokens that are part of a character (rare).
    return [
        (p.token_id, p.text, _logprob_out(p.logprob))
        if p.token_bytes is None
        else (p.token_id, p.text, _logprob_out(p.logprob), p.token_bytes.hex())
        for p in probs
    ]


def _probs_in(rows: list[list[Any]]) -> tuple[TokenProb, ...]:
    # Records saved before token bytes were kept have three elements per row.
    return tuple(
        TokenProb(int(r[0]), str(r[1]), _logprob_in(r[2]), bytes.fromhex(r[3]) if len(r) > 3 else None) for r in rows
    )


def alternatives_json(ev: TokenEvent) -> str:
    """The candidate lists of one token as compact JSON (the `top_json` column)."""
    doc: dict[str, Any] = {"m": _probs_out(ev.top_model), "s": _probs_out(ev.top_sampler)}
    if ev.token_bytes is not None:
        doc["b"] = ev.token_bytes.hex()
    if ev.stages is not None:
        # A stage's note ("top 20 from server") is a sixth field, only when there is one: older records
        # have five, and a local model's stages stay as small as before.
        doc["st"] = [
            [s.stage, s.survivors, s.mass_kept, s.entropy, _probs_out(s.top),
             *([s.note] if s.note or s.removed else []), *([list(s.removed)] if s.removed else [])]
            for s in ev.stages
        ]
    if ev.constraint is not None:  # structured output: what the constraint did here (docs/constraints.md)
        c = ev.constraint
        doc["c"] = [c.allowed, c.mass_kept, _probs_out(c.disallowed), int(c.forced), c.note]
    if ev.rewind is not None:  # a banned string made the loop step back here: the inspector says so after a restart
        r = ev.rewind
        doc["rw"] = [r.phrase, r.withdrawn, r.banned_token_id, r.banned_token_text]
    if ev.tool_position is not None:  # where it stands in a tool call: the call's confidence is read from it again
        doc["tp"] = ev.tool_position
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def token_row(message_id: int, ev: TokenEvent) -> tuple[Any, ...]:
    """One `tokens` table row (column order as in `store.SCHEMA`)."""
    return (
        message_id,
        ev.index,
        ev.token_id,
        ev.text,
        ev.token_text,
        ev.logprob,
        ev.sampler_logprob,
        ev.rank,
        ev.entropy,
        int(ev.forced),
        int(ev.special),
        alternatives_json(ev),
    )


def token_from_row(row: tuple[Any, ...]) -> TokenEvent:
    """Inverse of `token_row` (without the message id)."""
    idx, token_id, text, token_text, logprob, sampler_logprob, rank, entropy, forced, special, top = row
    doc = json.loads(top)
    stages = None
    if "st" in doc:
        stages = tuple(
            StageSnapshot(str(name), int(surv), float(mass), float(ent), _probs_in(top_rows), str(rest[0]) if rest else "",
                          tuple(int(t) for t in rest[1]) if len(rest) > 1 else ())  # a 7th field: the shown tokens cut
            for name, surv, mass, ent, top_rows, *rest in doc["st"]
        )
    return TokenEvent(
        index=int(idx),
        token_id=int(token_id),
        text=str(text),
        token_text=str(token_text),
        logprob=_logprob_in(logprob),
        sampler_logprob=_logprob_in(sampler_logprob),
        rank=int(rank),
        entropy=float(entropy),
        top_model=_probs_in(doc["m"]),
        top_sampler=_probs_in(doc["s"]),
        stages=stages,
        forced=bool(forced),
        special=bool(special),
        token_bytes=bytes.fromhex(doc["b"]) if "b" in doc else None,
        constraint=_constraint_in(doc.get("c")),
        rewind=_rewind_in(doc.get("rw")),
        tool_position=str(doc["tp"]) if "tp" in doc else None,
    )


def _rewind_in(row: list[Any] | None) -> Rewind | None:
    if not row:
        return None
    phrase, withdrawn, banned_id, banned_text = row
    return Rewind(str(phrase), int(withdrawn), int(banned_id), str(banned_text))


def _constraint_in(row: list[Any] | None) -> ConstraintStep | None:
    if not row:
        return None
    allowed, mass, disallowed, forced, note = row
    return ConstraintStep(int(allowed), float(mass), _probs_in(disallowed), bool(forced), str(note))


def token_to_json(ev: TokenEvent) -> dict[str, Any]:
    """A token record as standard JSON (non-finite log-probs become null), for export."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, bytes):
            return value.hex()
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    d = clean(ev.to_dict())
    d["prob"] = ev.prob
    d["sampler_prob"] = ev.sampler_prob
    return d
