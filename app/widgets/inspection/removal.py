"""Which sampler stage removed an alternative, read from the token's recorded stages.

Each recorded stage keeps its top N tokens and its survivor count. A token
missing from a stage's list was removed by it for sure only when that list
holds every survivor and the token was still listed just before; when earlier
lists were cut at the top N, the stages it may have fallen in are named
together. A banned string's stage says which phrase made the answer step back.
"""

from __future__ import annotations

from engine import TokenEvent

BANNED_STAGE = "banned_strings"  # engine.sampling.chain.BANNED_STAGE: where a pick's banned tokens are recorded


def stage_label(name: str) -> str:
    return name.replace("_", "-")


def removed_by(ev: TokenEvent, token_id: int) -> tuple[str, str] | None:
    """(a few words for a cell, a sentence for its tooltip) when a stage removed `token_id`; None otherwise."""
    stages = ev.stages or ()
    last_seen = -1 if any(p.token_id == token_id for p in ev.top_model) else None
    for i, s in enumerate(stages):
        listed = any(t.token_id == token_id for t in s.top)
        if listed:
            last_seen = i
            continue
        if s.survivors > len(s.top):
            continue  # this list is cut at the top N: absent from it says nothing
        suspects = [stage_label(x.stage) for x in stages[(last_seen + 1 if last_seen is not None else 0): i + 1]]
        if s.stage == BANNED_STAGE and ev.rewind is not None and ev.rewind.banned_token_id == token_id:
            phrase = ev.rewind.phrase
            return (f"banned {phrase!r} here",
                    f"banned {phrase!r} here: this token began the phrase, so the answer stepped back "
                    f"({ev.rewind.withdrawn} tokens) and this token may not be picked at this position")
        if last_seen == i - 1 or len(suspects) == 1:
            return f"cut: {suspects[-1]}", f"removed by {suspects[-1]}"
        return (f"cut: {suspects[-1]}?",
                f"removed by {', '.join(suspects[:-1])} or {suspects[-1]} (the lists before {suspects[-1]} "
                "hold only the top tokens, so which of them is not known)")
    return None
