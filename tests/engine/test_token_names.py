"""The report's alternatives are made by `TokenNames` without TokenProb's dataclass __init__ (issue 47: ~120 a
token); what it makes must be the very object the constructor makes."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from engine.events import TokenProb
from engine.sampling.alternatives import TokenNames, _token_prob


class _Vocab:
    def token_text(self, token_id: int) -> str:
        return "\ufffd" if token_id == 3 else f"t{token_id}"

    def token_bytes(self, token_id: int) -> bytes:
        return b"\xe2\x82" if token_id == 3 else f"t{token_id}".encode()


def test_the_fast_constructor_makes_what_the_dataclass_makes() -> None:
    for args in [(5, "a", -1.25, None), (0, "", float("-inf"), b"\xe2"), (-2, "(the rest)", -0.5, None)]:
        fast, slow = _token_prob(*args), TokenProb(*args)
        assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
        assert dataclasses.astuple(fast) == args and pickle.loads(pickle.dumps(fast)) == slow
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.logprob = 0.0  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(TokenProb)] == ["token_id", "text", "logprob", "token_bytes"]


def test_names_give_the_constructors_alternatives() -> None:
    pairs = ((7, -0.1), (3, -2.5), (7, -3.0), (11, -9.75))
    names = TokenNames(_Vocab())
    got = names(pairs)
    assert got == tuple(TokenProb(t, _Vocab().token_text(t), lp, b"\xe2\x82" if t == 3 else None) for t, lp in pairs)
    assert names(pairs) == got  # the second time from the cache of texts
    assert TokenNames(None)(pairs) == tuple(TokenProb(t, "", lp) for t, lp in pairs)
