"""Stop strings never leak into the emitted text, even when split across pieces."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.stopping import StopStringMatcher


def _run(pieces, stops):
    m = StopStringMatcher(stops)
    out, stopped = "", False
    for p in pieces:
        released, stopped = m.feed(p)
        out += released
        if stopped:
            break
    if not stopped:
        out += m.flush()
    return out, stopped


def test_stop_split_across_pieces_is_cut():
    assert _run(["Hello", " Wor", "ld<", "|e", "nd|> more"], ["<|end|>"]) == ("Hello World", True)


def test_partial_match_is_released_when_it_fails():
    m = StopStringMatcher(["STOP"])
    assert m.feed("abc ST") == ("abc ", False)  # "ST" could still become STOP
    assert m.feed("ART") == ("START", False)


def test_earliest_of_several_stops_wins():
    assert _run(["x\n\nUser: hi"], ["User:", "\n\n"]) == ("x", True)


@given(st.text(alphabet="ab\n", max_size=40), st.lists(st.integers(1, 5), max_size=20))
def test_output_is_text_before_first_stop(text, cuts):
    stop = "ab\n"
    pieces, i = [], 0
    for c in cuts:
        pieces.append(text[i : i + c])
        i += c
    pieces.append(text[i:])
    out, stopped = _run(pieces, [stop])
    if stop in text:
        assert stopped and out == text[: text.index(stop)]
    else:
        assert not stopped and out == text
