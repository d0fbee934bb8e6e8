"""Banned strings ("anti-slop"): phrases the answer must never contain.

Unlike a stop string, a banned phrase does not end the answer: when the text
would contain one, the decode loop steps back to the token where the phrase
began, bans that token at that position, and generates again from there (the
approach of KoboldCpp's and text-generation-webui's banned strings). Tokens
that could still turn into a banned phrase are therefore held back, at token
granularity, until they either complete one (then they are withdrawn) or
cannot anymore (then their text is released): text once released is never
taken back, so a consumer that only concatenates `TokenEvent.text` sees the
final answer.

Matching is exact and case-sensitive, on the decoded text.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ban:
    """A banned phrase completed: it began in the token at `start` (an index among generated tokens)."""

    phrase: str
    start: int


class BannedStringGuard:
    """Watches the generated text for banned phrases, token by token.

    Tokens are numbered from 0 in the order they are fed; `rewind(i)` forgets
    token i and everything after it.
    """

    def __init__(self, phrases: Sequence[str]) -> None:
        self.phrases = tuple(p for p in phrases if p)
        self._text = ""
        self._starts: list[int] = []  # where each token's text begins in _text
        self._released = 0

    @property
    def active(self) -> bool:
        return bool(self.phrases)

    @property
    def held_from(self) -> int:
        """Index of the first token whose text has not all been released (= tokens fed if none).

        Tokens at the end that produced no text yet (the detokenizer holds an unfinished character) count
        as held: the text they complete is theirs, so a banned phrase in it steps back to them."""
        if self._released < len(self._text):
            return self._token_at(self._released)
        return bisect.bisect_left(self._starts, len(self._text))

    def feed(self, index: int, piece: str) -> tuple[str, Ban | None]:
        """Token `index` added `piece` to the text.

        Returns:
            (text that is now safe to release, None), or ("", the ban) when a
            banned phrase completed; the caller then rewinds to `ban.start`.
        """
        if self.phrases and index != len(self._starts):
            raise ValueError(f"token {index} fed out of order (expected {len(self._starts)})")
        self._starts.append(len(self._text))
        self._text += piece
        if not self.phrases:
            return self._release(len(self._text)), None
        found = [(i, p) for p in self.phrases if (i := self._text.find(p, self._released)) != -1]
        if found:
            at, phrase = min(found)
            return "", Ban(phrase, self._token_at(at))
        hold = self._held_back()
        if hold == 0:
            return self._release(len(self._text)), None
        return self._release(self._starts[self._token_at(len(self._text) - hold)]), None

    def rewind(self, index: int) -> None:
        """Forget token `index` and the ones after it (their text was never released)."""
        cut = self._starts[index] if index < len(self._starts) else len(self._text)
        assert cut >= self._released, "released text cannot be withdrawn"
        self._text = self._text[:cut]
        del self._starts[index:]

    def give_up(self) -> str:
        """Stop watching: release everything, the phrase just found included (it could not be banned)."""
        self.phrases = ()
        return self._release(len(self._text))

    def finish(self, piece: str = "") -> str:
        """The answer ended: release what is held back, plus `piece` (what the detokenizer still held)."""
        self._text += piece
        return self._release(len(self._text))

    def _token_at(self, char: int) -> int:
        """The first token that produced character `char` (a token that ended inside a character produced
        no text of its own; the character belongs to it and to the token that completed it)."""
        i = bisect.bisect_right(self._starts, char) - 1
        return bisect.bisect_left(self._starts, self._starts[i])

    def _held_back(self) -> int:
        """Length of the longest unreleased suffix of the text that is a proper prefix of a banned phrase."""
        longest = 0
        tail = len(self._text) - self._released
        for p in self.phrases:
            for n in range(min(len(p) - 1, tail), longest, -1):
                if self._text.endswith(p[:n]):
                    longest = n
                    break
        return longest

    def _release(self, upto: int) -> str:
        upto = max(upto, self._released)
        out = self._text[self._released : upto]
        self._released = upto
        return out
