"""Issue 37 item 12: the stage view says "banned" for a token a logit bias of -inf removed, and shows a
banned string's step back; a step-mode answer's speed leaves out the time the person took to choose."""

from __future__ import annotations

import math
import threading
import time

from engine import Done, Engine, GenerationRequest, SamplerSettings, TokenEvent
from engine.backends.mock import MockBackend
from engine.decode.loop import generate_events

from app.widgets.inspection.bars import MISSING_ROLE
from app.widgets.fmt import visible
from app.widgets.inspection.stage_view import StageView

PROMPT = "the cat"


def _events(sampler: SamplerSettings, n: int = 6) -> list[TokenEvent]:
    engine = Engine.from_backend(MockBackend())
    try:
        request = GenerationRequest(prompt=PROMPT, sampler=sampler, max_new_tokens=n, record_stages=True)
        return [e for e in engine.generate(request) if isinstance(e, TokenEvent)]
    finally:
        engine.close()


def test_a_token_banned_by_logit_bias_shows_banned_not_a_dot(qtbot):
    greedy = SamplerSettings(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
    first = _events(greedy, 1)[0]
    runner_up = first.top_model[1]  # the model's second choice at the first step
    ev = _events(greedy.with_(logit_bias=((runner_up.token_id, -math.inf),)), 1)[0]
    assert ev.token_id == first.token_id
    stage = next(s for s in ev.stages if s.stage == "logit_bias")
    assert stage.survivors > len(stage.top)  # the list is cut at N: absence alone said nothing ("·" before)
    assert runner_up.token_id in stage.removed

    view = StageView()
    qtbot.addWidget(view)
    view.show_token(ev)
    row = _row_of(view, runner_up.text)
    col = _column_of(view, "logit-bias")
    assert view.table.item(row, col).data(MISSING_ROLE) == "banned"
    assert "banned" in view.table.item(row, col).toolTip()
    # A token the stage only pushed out of its top N is still "·", and the chosen one has its probability.
    assert view.table.item(_row_of(view, ev.token_text), col).data(MISSING_ROLE) in ("·", None)


def test_a_banned_string_step_back_is_shown_in_the_stage_view(qtbot):
    greedy = SamplerSettings(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
    plain = _events(greedy, 4)
    phrase = plain[1].token_text.strip()  # the answer's second word, banned: the loop must step back there
    events = _events(greedy.with_(banned_strings=(phrase,)), 4)
    ev = next(e for e in events if e.rewind is not None)
    assert ev.rewind.phrase == phrase

    view = StageView()
    qtbot.addWidget(view)
    view.show_token(ev)
    note = view.note.text()
    assert "Stepped back" in note and phrase in note and "banned" in note
    col = _column_of(view, "banned-strings")
    row = _row_of(view, ev.rewind.banned_token_text)
    assert view.table.item(row, col).data(MISSING_ROLE) == "banned"
    assert phrase in view.table.item(row, col).toolTip()


def test_step_mode_speed_leaves_out_the_persons_pauses():
    pause_s = 0.15
    request = GenerationRequest(prompt=PROMPT, sampler=SamplerSettings(temperature=0.0), max_new_tokens=6, ignore_eos=True)

    def slow_person(event: TokenEvent) -> None:
        time.sleep(pause_s)  # the person looks at the token, then takes the sampler's pick
        return None

    events = list(generate_events(MockBackend(), request, threading.Event(), choose=slow_person))
    stats = events[-1].stats
    assert isinstance(events[-1], Done) and stats.generated_tokens == 6
    # Six pauses of 0.15 s: counted in, the speed would be under 1 / 0.15 = 6.7 tokens/s and the first
    # token would take 0.15 s; the mock model itself is thousands of tokens/s.
    assert stats.decode_tokens_per_s > 100, stats
    assert stats.time_to_first_token_s < pause_s / 2, stats
    assert stats.total_s >= 6 * pause_s  # the wall time stays what it was


def _column_of(view: StageView, label: str) -> int:
    table = view.table
    return next(c for c in range(table.columnCount()) if table.horizontalHeaderItem(c).text().split("\n")[0] == label)


def _row_of(view: StageView, token_text: str) -> int:
    table = view.table
    for r in range(table.rowCount()):
        if table.item(r, 0).text().removeprefix("▶ ") == visible(token_text, None):
            return r
    raise AssertionError(f"no row for {token_text!r}: {[table.item(r, 0).text() for r in range(table.rowCount())]}")
