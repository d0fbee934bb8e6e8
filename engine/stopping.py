"""Stop strings: find them in streamed text and never emit their text.

Text that could still turn into a stop string is held back until it either
completes one (then it is dropped) or cannot anymore (then it is released).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self._text = ""
        self._released = 0

    @property
    def text(self) -> str:
        """All text released so far."""
        return self._text[: self._released]

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add `piece`; return (text safe to emit now, whether a stop string completed)."""
        self._text += piece
        if not self.stops:
            return self._release(len(self._text)), False
        # A stop string may straddle earlier pieces: search from just before what is unreleased.
        start = max(0, self._released - max(len(s) for s in self.stops))
        hits = [i for i in (self._text.find(s, start) for s in self.stops) if i != -1]
        if hits:
            cut = min(hits)
            out = self._release(cut)
            self._text = self._text[:cut]
            return out, True
        return self._release(len(self._text) - self._held_back()), False

    def flush(self) -> str:
        """Release everything held back (the generation ended for another reason)."""
        return self._release(len(self._text))

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self._text)), longest, -1):
                if self._text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _release(self, upto: int) -> str:
        upto = max(upto, self._released)
        out = self._text[self._released : upto]
        self._released = upto
        return out
