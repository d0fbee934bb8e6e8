"""Where a tool call's branches start and which tokens they force (Qt-free).

- "Answer instead": at the decision token (the call opener's first), an alternative that does not begin the
  opener (text), most likely first;
- "Call another tool": at the token where the allowed names part, the other name's characters from there on
  (what the decision token wrote before its name characters, a quote, kept), tokenized by the caller;
- "Other value": at an argument's first value token, the model's other alternatives there that the answer's
  constraint allowed (the removed ones are on the token's `ConstraintStep`).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine import CallConfidence, TokenEvent, TokenProb

OPENER_TEXT = "<tool_call>"  # the built-in and Hermes formats' opener (others: the token records say)


def _name_chars(text: str) -> str:
    """The tool name's characters in the name span's text so far (engine.tools.confidence reads it so)."""
    s = text.lstrip()
    if s.startswith(":"):
        s = s[1:].lstrip()
    if s.startswith('"'):
        s = s[1:]
    return s.partition('"')[0]


def _opener_text(tokens: Sequence[TokenEvent], start: int) -> str:
    return "".join(t.token_text for t in tokens[start:] if t.tool_position == "opener").lstrip() or OPENER_TEXT


def text_alternatives(conf: CallConfidence, tokens: Sequence[TokenEvent], limit: int = 6) -> list[TokenProb]:
    """The model's tokens at the decision point that answer in text (not the opener, not white space alone)."""
    d = conf.decision
    if d is None:
        return []
    opener = _opener_text(tokens, d.token.index)
    out = []
    for t in sorted(d.alternatives, key=lambda t: -t.logprob):
        piece = t.text.lstrip()
        if t.is_rest or not piece or opener.startswith(piece) or piece.startswith(opener):
            continue
        out.append(t)
    return out[:limit]


def other_names(conf: CallConfidence) -> list[str]:
    """The allowed names the model did not call, most likely first."""
    if conf.name is None:
        return []
    return [o.name for o in conf.name.options if o.name != conf.call.name]


def name_text_from_decision(conf: CallConfidence, tokens: Sequence[TokenEvent], other: str) -> str | None:
    """The text to force at the name's decision token so the call names `other` (None: it cannot from here)."""
    n = conf.name
    if n is None:
        return None
    d = n.token.index
    start = conf.decision.token.index if conf.decision is not None else 0
    acc = "".join(t.token_text for t in tokens[start:d] if t.tool_position == "name")
    before = _name_chars(acc)
    if not other.startswith(before):
        return None
    text = tokens[d].token_text
    lead = text
    for i in range(1, len(text) + 1):
        if len(_name_chars(acc + text[:i])) > len(before):
            lead = text[: i - 1]
            break
    return lead + other[len(before):]


def value_alternatives(token: TokenEvent, alternatives: Sequence[TokenProb], limit: int = 8) -> list[TokenProb]:
    """The other tokens the model had at an argument's first value token, the constraint's removed ones left out."""
    removed = {t.token_id for t in token.constraint.disallowed} if token.constraint is not None else set()
    out = [t for t in sorted(alternatives, key=lambda t: -t.logprob)
           if not t.is_rest and t.token_id != token.token_id and t.token_id not in removed]
    return out[:limit]
