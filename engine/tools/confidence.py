"""What the model decided in each tool call, read from the answer's token records: `call_confidence`.

For every parsed call, from the `TokenEvent`s already kept (their `tool_position`, engine.tools.tracker):

- **the decision** (`CallDecision`): at the call opener's first token, the model's probability of that token
  and of every listed alternative that would also begin the opener (`call_prob`: calling at all), against the
  rest (answering in text); `opener_prob` is the whole opener as written (the product over its tokens).
- **the name** (`NameChoice`): at the first token where the allowed names part (the token that writes the
  name's first characters when one name is allowed), each allowed name's *model* probability — the sum of the
  listed tokens there that lead to that name and to no other — and, labelled apart, its *share inside the
  allowed names* (those probabilities renormalised over the allowed names only: not the model's probability).
  A name none of whose tokens is listed is below `floor`, the lowest listed probability.
- **each argument** (`ArgumentConfidence`, top-level keys of the arguments): its value's probability, the
  product over the tokens of that argument (its colon and value, quotes and white space the model wrote
  included, as the tracker assigns them), i.e. exp(sum of their log-probs); its weakest token; and the
  alternatives at its first token that writes the value (after white space and a string's opening quote).

All probabilities are the model's (`TokenEvent.logprob`, `top_model`), before the sampler and the constraint.
`top_model` lists only the top N: the sums are over what is listed (a server's "rest" entry never counts).
Pure Python over a call's few dozen events, well under a millisecond per call. Nothing here raises on an
answer the tracker followed in part: what cannot be found is None.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.events import TokenEvent, TokenProb
from engine.tools.calls import ToolCall


@dataclass(frozen=True, slots=True)
class TokenAt:
    """One token of the answer: where it stands (0-based among the generated tokens), its text, its log-prob."""

    index: int
    text: str
    logprob: float

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)


@dataclass(frozen=True, slots=True)
class CallDecision:
    """Calling at all: the opener's first token, against answering in text."""

    token: TokenAt  # the opener's first token, as taken
    call_prob: float  # listed tokens there that begin the opener (the taken one included)
    opener_prob: float  # the whole opener as written: the product over its tokens
    alternatives: tuple[TokenProb, ...]  # the model's top tokens there

    @property
    def text_prob(self) -> float:
        """1 - call_prob: answering in text (or starting the call with a token not listed)."""
        return max(0.0, 1.0 - self.call_prob)


@dataclass(frozen=True, slots=True)
class NameOption:
    """One allowed tool name at the name's decision token."""

    name: str
    model_prob: float  # the model's own probability of the listed tokens that lead to this name only
    listed: bool  # some token leading to it is among the listed ones (else model_prob is 0 and below `floor`)
    share_of_allowed: float  # model_prob renormalised over the allowed names only (NOT the model's probability)


@dataclass(frozen=True, slots=True)
class NameChoice:
    """Which tool: the allowed names at the token where they part."""

    token: TokenAt  # the decision token, as taken
    chosen: str
    options: tuple[NameOption, ...]  # every allowed name, most likely first
    undecided_prob: float  # listed tokens there that still lead to more than one allowed name
    floor: float  # the lowest listed probability there: an unlisted name is below it
    written_prob: float  # the name as written, quotes included: the product over its tokens


@dataclass(frozen=True, slots=True)
class ArgumentConfidence:
    """One top-level argument: how likely its value was, token by token."""

    name: str
    value: str  # the value as JSON text
    logprob: float  # the sum of the argument's tokens' log-probs
    tokens: tuple[TokenAt, ...]
    weakest: TokenAt
    first: TokenAt  # the first token that writes the value
    alternatives: tuple[TokenProb, ...]  # the model's top tokens at `first`

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)


@dataclass(frozen=True, slots=True)
class CallConfidence:
    """What the model decided in one call; None where the answer's records do not show it."""

    call: ToolCall
    decision: CallDecision | None
    name: NameChoice | None
    arguments: tuple[ArgumentConfidence, ...]

    def describe(self) -> str:
        """A few lines for the command line."""
        lines = [f"call {self.call.name}({self.call.arguments})"]
        if self.decision is not None:
            d = self.decision
            lines.append(f"  call vs text: p(call)={d.call_prob:.3f} at token {d.token.index} {d.token.text!r} "
                         f"(p={d.token.prob:.3f}; whole opener {d.opener_prob:.3g}); p(text or other)={d.text_prob:.3f}")
        if self.name is not None:
            n = self.name
            shown = ", ".join(
                f"{o.name} {o.model_prob:.3f}" if o.listed else f"{o.name} <{n.floor:.3f} (not listed)" for o in n.options)
            share = ", ".join(f"{o.name} {o.share_of_allowed:.0%}" for o in n.options)
            lines.append(f"  tool name at token {n.token.index} {n.token.text!r}: model p: {shown}"
                         + (f"; still shared {n.undecided_prob:.3f}" if n.undecided_prob > 0 else ""))
            lines.append(f"    share inside the allowed names (renormalised, not the model's p): {share}")
        for a in self.arguments:
            alts = ", ".join(f"{t.text!r} {t.prob:.3f}" for t in a.alternatives[:4] if not t.is_rest)
            lines.append(f"  argument {a.name} = {a.value}: p={a.prob:.3g} over {len(a.tokens)} tokens; weakest "
                         f"{a.weakest.text!r} p={a.weakest.prob:.3f} at token {a.weakest.index}; at {a.first.text!r}: {alts}")
        return "\n".join(lines)


def kept_events(events: Sequence[TokenEvent]) -> list[TokenEvent]:
    """The answer's events as kept: one that carries a rewind voids those before it from its index on."""
    out: list[TokenEvent] = []
    for e in events:
        del out[e.index:]
        out.append(e)
    return out


def call_confidence(events: Sequence[TokenEvent], calls: Sequence[ToolCall],
                    allowed: Sequence[str]) -> tuple[CallConfidence, ...]:
    """Each of `calls` (the answer's parsed calls, in order) with its confidence from `events` (the answer's
    token events); `allowed`: the tool names the model could call (one under a named tool_choice)."""
    kept = kept_events(events)
    spans = _call_spans(kept)
    out = []
    s = 0
    for call in calls:
        span: list[TokenEvent] | None = None
        for j in range(s, len(spans)):  # the next span that wrote this call's name (a broken one is skipped)
            if _name_text(spans[j]) == call.name:
                span, s = spans[j], j + 1
                break
        if span is None:
            out.append(CallConfidence(call, None, None, ()))
            continue
        out.append(CallConfidence(call, _decision(span), _name_choice(span, call.name, allowed),
                                  _arguments(span, call)))
    return tuple(out)


# --- the call's spans ---------------------------------------------------------------------------------------------


def _call_spans(events: Sequence[TokenEvent]) -> list[list[TokenEvent]]:
    """Runs of events inside a call; a new one starts at an opener after text or after a closer."""
    spans: list[list[TokenEvent]] = []
    prev: str | None = None
    for e in events:
        pos = e.tool_position
        if pos is not None and (prev is None or pos == "opener" and prev == "closer"):
            spans.append([])
        if pos is not None:
            spans[-1].append(e)
        prev = pos
    return spans


def _name_text(span: Sequence[TokenEvent]) -> str:
    return "".join(e.token_text for e in span if e.tool_position == "name").strip().strip('",').strip()


def _at(e: TokenEvent) -> TokenAt:
    return TokenAt(e.index, e.token_text, e.logprob)


def _candidates(e: TokenEvent) -> list[TokenProb]:
    """The listed tokens at `e` (a server's rest entry left out), the taken one added when not listed."""
    listed = [t for t in e.top_model if not t.is_rest]
    if all(t.token_id != e.token_id for t in listed):
        listed.append(TokenProb(e.token_id, e.token_text, e.logprob))
    return listed


# --- the decision, the name, the arguments --------------------------------------------------------------------------


def _decision(span: Sequence[TokenEvent]) -> CallDecision | None:
    opener = [e for e in span if e.tool_position == "opener"]
    if not opener:
        return None
    first = opener[0]
    written = "".join(e.token_text for e in opener).lstrip()
    call_prob = 0.0
    for t in _candidates(first):
        piece = t.text.lstrip()
        if piece and (written.startswith(piece) or piece.startswith(written)):
            call_prob += t.prob
    return CallDecision(_at(first), min(call_prob, 1.0), math.exp(sum(e.logprob for e in opener)), first.top_model)


def _name_chars(text: str) -> tuple[str, bool]:
    """The name characters in the name span's text so far, and whether its closing quote has come."""
    s = text.lstrip()
    if s.startswith(":"):
        s = s[1:].lstrip()
    if s.startswith('"'):
        s = s[1:]
    head, quote, _ = s.partition('"')
    return head, bool(quote)


def _leads_to(chars: str, closed: bool, name: str, before: str) -> bool:
    """Name text `chars` (closed: its quote came) is on the way to `name` and adds to `before`."""
    if len(chars) <= len(before) and not closed:
        return False
    return chars == name if closed else name.startswith(chars)


def _name_choice(span: Sequence[TokenEvent], chosen: str, allowed: Sequence[str]) -> NameChoice | None:
    tokens = [e for e in span if e.tool_position == "name"]
    names = list(dict.fromkeys(allowed)) or [chosen]
    if chosen not in names:
        names.append(chosen)
    decision: TokenEvent | None = None
    before_text = ""
    acc = ""
    for e in tokens:
        prefix, _ = _name_chars(acc)
        after, closed = _name_chars(acc + e.token_text)
        still = [n for n in names if n.startswith(prefix)]
        narrowed = [n for n in still if _leads_to(after, closed, n, prefix)]
        adds = len(after) > len(prefix) or closed
        if adds and (len(still) <= 1 or len(narrowed) < len(still)):
            decision, before_text = e, acc
            break
        acc += e.token_text
    if decision is None:
        return None
    before, _ = _name_chars(before_text)
    probs = dict.fromkeys(names, 0.0)
    listed = dict.fromkeys(names, False)
    undecided = 0.0
    cands = _candidates(decision)
    for t in cands:
        chars, closed = _name_chars(before_text + t.text)
        leads = [n for n in names if _leads_to(chars, closed, n, before)]
        if len(leads) == 1:
            probs[leads[0]] += t.prob
            listed[leads[0]] = True
        elif leads:
            undecided += t.prob
    total = sum(probs.values())
    options = sorted((NameOption(n, probs[n], listed[n], probs[n] / total if total > 0 else 0.0) for n in names),
                     key=lambda o: -o.model_prob)
    floor = min((t.prob for t in cands), default=0.0)
    return NameChoice(_at(decision), chosen, tuple(options), undecided, floor,
                      math.exp(sum(e.logprob for e in tokens)))


def _argument_of(position: str | None, keys: frozenset[str]) -> str | None:
    """The top-level argument a token's position belongs to ("arguments.stops[1].lat" -> "stops"), or None."""
    if position is None or not position.startswith("arguments."):
        return None
    rest = position[len("arguments."):]
    if rest in keys:
        return rest
    for i, ch in enumerate(rest):  # the longest key that ends where a nested path begins
        if ch in ".[" and rest[:i] in keys:
            return rest[:i]
    return None


def _writes_value(text: str) -> bool:
    s = text.lstrip()
    if s.startswith(":"):
        s = s[1:].lstrip()
    if s.startswith('"'):
        s = s[1:]
    return bool(s)


def _arguments(span: Sequence[TokenEvent], call: ToolCall) -> tuple[ArgumentConfidence, ...]:
    try:
        args = call.parsed_arguments()
    except ValueError:
        return ()
    keys = frozenset(args)
    by_key: dict[str, list[TokenEvent]] = {}
    for e in span:
        key = _argument_of(e.tool_position, keys)
        if key is not None:
            by_key.setdefault(key, []).append(e)
    out = []
    for key, value in args.items():
        mine = by_key.get(key)
        if not mine:
            continue
        acc = ""
        first = mine[0]
        for e in mine:
            acc += e.token_text
            if _writes_value(acc):
                first = e
                break
        weakest = min(mine, key=lambda e: e.logprob)
        out.append(ArgumentConfidence(key, json.dumps(value, ensure_ascii=False), sum(e.logprob for e in mine),
                                      tuple(_at(e) for e in mine), _at(weakest), _at(first), first.top_model))
    return tuple(out)
