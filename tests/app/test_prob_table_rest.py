"""The alternatives table for a server's top N: the server's own probabilities and one "rest" row (issue 20 item 11)."""

from __future__ import annotations

import math

import pytest

from engine import TokenEvent, TokenProb
from engine.events import REST_TOKEN_ID, REST_TEXT
from PySide6.QtCore import Qt

from app.widgets.inspection.bars import PROB_ROLE
from app.widgets.inspection.prob_table import ProbTable


def _event() -> TokenEvent:
    model = (TokenProb(10, " Paris", math.log(0.6)), TokenProb(11, " the", math.log(0.25)),
             TokenProb(REST_TOKEN_ID, REST_TEXT, math.log(0.15)))
    sampler = (TokenProb(10, " Paris", math.log(0.6 / 0.85)), TokenProb(11, " the", math.log(0.25 / 0.85)))
    return TokenEvent(index=0, token_id=10, text=" Paris", token_text=" Paris", logprob=math.log(0.6),
                      sampler_logprob=math.log(0.6 / 0.85), rank=0, entropy=1.0, top_model=model, top_sampler=sampler)


def test_the_rest_is_one_last_row_that_cannot_be_branched_on(qtbot):
    table = ProbTable()
    qtbot.addWidget(table)
    table.show_token(_event())
    rows = [table.topLevelItem(i) for i in range(table.topLevelItemCount())]
    assert len(rows) == 3 and rows[-1].text(0) == REST_TEXT
    rest = rows[-1]
    assert rest.data(1, PROB_ROLE) == pytest.approx(0.15)  # the model's own, not renormalised
    assert rest.data(2, PROB_ROLE) is None and "did not report" in rest.toolTip(0)
    assert not rest.flags() & Qt.ItemFlag.ItemIsSelectable
    assert rows[0].data(1, PROB_ROLE) == pytest.approx(0.6)
    branched = []
    table.branch_requested.connect(branched.append)
    table._on_activated(rest)
    assert branched == []
    table._on_activated(rows[1])
    assert branched == [11]


def test_rows_are_tall_enough_for_their_percentages(qtbot):
    """The bars' numbers were drawn inside the inset bar, so in a monospace row they were cut in half."""
    table = ProbTable()
    qtbot.addWidget(table)
    table.resize(320, 300)
    table.show()
    table.show_token(_event())
    row = table.visualItemRect(table.topLevelItem(0))
    assert row.height() >= table.fontMetrics().height() + 4
