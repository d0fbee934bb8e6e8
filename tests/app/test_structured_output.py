"""Structured output in the window: the control sets the constraint, refusals are greyed, records keep it."""

from __future__ import annotations

import math

from PySide6.QtCore import Qt

from engine import Constraint, ConstraintStep, StageSnapshot, TokenEvent, TokenProb

from app.state.database.records import token_from_row, token_row
from app.state.settings import SettingsState
from app.widgets.chat.constraint_marks import DISALLOWED_ROLE
from app.widgets.inspection.prob_table import ProbTable
from app.widgets.sampling.structured_output import EXAMPLES, StructuredOutputBox


def test_the_control_sets_a_valid_constraint_and_refuses_a_bad_one(qtbot, window, store):
    box = window.sampling.findChild(StructuredOutputBox)
    assert box is not None and window.settings.options.constraint is None
    box.mode.setCurrentIndex(box.mode.findText("Regex"))
    box.editor.setPlainText(r"(yes|no)\.")
    box.apply()  # checked off the UI thread
    qtbot.waitUntil(lambda: not box.checking)
    assert box.valid
    assert window.settings.options.constraint == Constraint.regex(r"(yes|no)\.")
    assert SettingsState(store).options.constraint == Constraint.regex(r"(yes|no)\.")  # saved with the options

    box.editor.setPlainText("(yes|no")  # typed on: refused with the reason, the last good one stays (but is not sent)
    box.apply()
    qtbot.waitUntil(lambda: not box.checking)
    assert box.valid is False
    assert "unclosed group" in box.status.text()
    assert window.settings.options.constraint == Constraint.regex(r"(yes|no)\.")

    name = next(n for n in EXAMPLES if "JSON schema" in n)
    box.examples.activated.emit(box.examples.findText(name))
    qtbot.waitUntil(lambda: not box.checking)
    assert window.settings.options.constraint.kind == "json_schema"
    assert box.mode.currentText() == "JSON schema"

    box.mode.setCurrentIndex(box.mode.findText("Off"))
    assert window.settings.options.constraint is None and not box.editor.isEnabled()


def _event() -> TokenEvent:
    """A step where the constraint allowed '{' only: the model's favourite '```' was removed."""
    ticks, brace, here = TokenProb(7, "```", math.log(0.7)), TokenProb(8, "{", math.log(0.2)), TokenProb(9, "Here", math.log(0.1))
    step = ConstraintStep(allowed=1, mass_kept=0.2, disallowed=(ticks, here), forced=True, note="the only token the grammar allows")
    stage = StageSnapshot("grammar", 1, 0.2, 0.0, (TokenProb(8, "{", 0.0),))
    return TokenEvent(index=0, token_id=8, text="{", token_text="{", logprob=brace.logprob, sampler_logprob=0.0, rank=1,
                      entropy=0.8, top_model=(ticks, brace, here), top_sampler=(TokenProb(8, "{", 0.0),),
                      stages=(stage,), constraint=step)


def test_disallowed_alternatives_are_greyed_with_the_reason_and_never_branched(qtbot):
    table = ProbTable()
    qtbot.addWidget(table)
    table.show_token(_event())
    rows = {int(table.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole + 3)): table.topLevelItem(i)
            for i in range(table.topLevelItemCount())}
    assert rows[7].data(0, DISALLOWED_ROLE) and "not allowed" in rows[7].toolTip(0)
    assert rows[8].data(0, DISALLOWED_ROLE) is None  # the chosen token
    with qtbot.assertNotEmitted(table.branch_requested):
        table._on_activated(rows[7])
    with qtbot.waitSignal(table.branch_requested):
        table._on_activated(rows[8])


def test_a_token_record_keeps_what_the_constraint_did():
    ev = _event()
    back = token_from_row(token_row(1, ev)[1:])
    assert back.constraint == ev.constraint
