"""The alternatives table's Sampler column for the drawn token when it ranks below the sampler's recorded top N.

The notebook screenshot showed "thousand" with p(sampler) 1.6 % in the inspector's header and "·" ("not
among the top candidates recorded") in its own Sampler cell: the event records the drawn token's sampler
probability, the table only looked in the top-N list.
"""

from __future__ import annotations

import math

import pytest

from engine import TokenEvent, TokenProb

from app.widgets.inspection.bars import MISSING_ROLE, PROB_ROLE
from app.widgets.inspection.prob_table import TOKEN_ID_ROLE, ProbTable


def _event(drawn_logprob: float, forced: bool = False) -> TokenEvent:
    """A flat distribution: 20 words of 3 % each are recorded for the sampler; the draw was the 27th, " thousand"."""
    words = [f" w{i}" for i in range(20)]
    model = tuple(TokenProb(i, w, math.log(0.03)) for i, w in enumerate(words)) + (TokenProb(99, " thousand", math.log(0.008)),)
    sampler = tuple(TokenProb(i, w, math.log(0.04)) for i, w in enumerate(words))
    return TokenEvent(index=7, token_id=99, text=" thousand", token_text=" thousand", logprob=math.log(0.008),
                      sampler_logprob=drawn_logprob, rank=26, entropy=6.0, top_model=model, top_sampler=sampler,
                      forced=forced)


def _row(table: ProbTable, token_id: int):
    return next(table.topLevelItem(i) for i in range(table.topLevelItemCount())
                if int(table.topLevelItem(i).data(0, TOKEN_ID_ROLE)) == token_id)


def test_the_drawn_token_shows_its_sampler_probability_beyond_the_top_n(qtbot):
    table = ProbTable()
    qtbot.addWidget(table)
    table.show_token(_event(math.log(0.016)))
    row = _row(table, 99)
    assert row.text(0) == "▶ ␣thousand"
    assert row.data(1, PROB_ROLE) == pytest.approx(0.008)
    assert row.data(2, PROB_ROLE) == pytest.approx(0.016)  # what the header's p(sampler) says, not "·"
    others = [table.topLevelItem(i) for i in range(table.topLevelItemCount()) if table.topLevelItem(i) is not row]
    assert all(o.data(2, PROB_ROLE) == pytest.approx(0.04) for o in others)


def test_a_forced_token_the_sampler_had_cut_still_says_cut(qtbot):
    table = ProbTable()
    qtbot.addWidget(table)
    table.show_token(_event(float("-inf"), forced=True))
    row = _row(table, 99)
    assert row.data(2, PROB_ROLE) is None and row.data(2, MISSING_ROLE) == "cut"
