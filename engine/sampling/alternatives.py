"""A chain's alternatives as `TokenProb`: the one type every reader of a token's alternatives gets.

The distributions inside the chain list their top N as (token id, log-prob) pairs (`Dist.top`, cached and
compared cheaply); `Pick`, `StageStats` and `TokenEvent` hold `TokenProb`, named here once per report with
the chain's tokenizer. A token's text and partial bytes are looked up once per chain and kept: a run shows
the same few hundred ids again and again.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from engine.events import TokenProb
from engine.sampling.distribution import TopList
from engine.tokenizer import partial_token_bytes


class TokenNames:
    """Turns (token id, log-prob) pairs into `TokenProb`, with the text of `vocab` (its `token_text`).

    Without a tokenizer (or one without `token_text`), every text is "": the ids and numbers are still exact.
    """

    __slots__ = ("_bytes", "_known", "_text", "_vocab")

    def __init__(self, vocab: Any | None) -> None:
        self._vocab = vocab
        self._text = getattr(vocab, "token_text", None)
        self._bytes = hasattr(vocab, "token_bytes")  # partial bytes need them; without, `text` is all there is
        self._known: dict[int, tuple[str, bytes | None]] = {}  # id -> (text, partial bytes or None)

    def _name(self, token_id: int) -> tuple[str, bytes | None]:
        if self._text is None:
            named: tuple[str, bytes | None] = ("", None)
        else:
            text = self._text(token_id)
            named = (text, partial_token_bytes(self._vocab, token_id, text) if self._bytes else None)
        self._known[token_id] = named
        return named

    def __call__(self, pairs: TopList) -> tuple[TokenProb, ...]:
        known = self._known
        out = []
        for token_id, logprob in pairs:
            named = known.get(token_id) or self._name(token_id)
            out.append(_token_prob(token_id, named[0], logprob, named[1]))
        return tuple(out)


# A report names ~120 alternatives a token (the model's, the sampler's and each stage's top 20). A frozen
# dataclass's __init__ sets each field through object.__setattr__ (0.5 µs an object here); setting the slots
# through their descriptors makes the same object in 0.3 µs. TokenProb has no __post_init__ or defaults that
# compute anything, and the fields are taken from the class itself, so the two cannot drift apart
# (tests/engine/test_token_names.py compares them).
_SLOT_SETTERS = tuple(getattr(TokenProb, f.name).__set__ for f in fields(TokenProb))
assert not hasattr(TokenProb, "__post_init__") and len(_SLOT_SETTERS) == 4


def _token_prob(token_id: int, text: str, logprob: float, token_bytes: bytes | None,
                _new: Any = object.__new__, _set: tuple[Any, ...] = _SLOT_SETTERS) -> TokenProb:
    """`TokenProb(token_id, text, logprob, token_bytes)`, made faster (see `_SLOT_SETTERS`)."""
    out = _new(TokenProb)
    _set[0](out, token_id)
    _set[1](out, text)
    _set[2](out, logprob)
    _set[3](out, token_bytes)
    return out
