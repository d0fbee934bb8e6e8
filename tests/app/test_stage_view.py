"""The stage view's note says what the sampler did: greedy is named as such, not as "neutral"."""

from __future__ import annotations

from engine import Engine, GenerationRequest, SamplerSettings, TokenEvent
from engine.backends.mock import MockBackend

from app.widgets.inspection.stage_view import StageView


def _first_event(sampler: SamplerSettings) -> TokenEvent:
    """A real token event from the engine's sampler chain (on the mock model), stages recorded."""
    engine = Engine.from_backend(MockBackend())
    try:
        request = GenerationRequest(prompt="the cat", sampler=sampler, max_new_tokens=2, record_stages=True)
        return next(e for e in engine.generate(request) if isinstance(e, TokenEvent))
    finally:
        engine.close()


def test_greedy_is_named_and_neutral_stays_neutral(qtbot):
    view = StageView()
    qtbot.addWidget(view)

    view.show_token(_first_event(SamplerSettings(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)))
    note = view.note.text().lower()
    assert "greedy" in note and "neutral" not in note

    # Greedy after a filter: the stages are listed and the pick is still said to be greedy.
    view.show_token(_first_event(SamplerSettings(temperature=0.0, top_k=5, top_p=1.0, min_p=0.0, repetition_penalty=1.0)))
    note = view.note.text().lower()
    assert "top-k" in note and "greedy" in note

    # Every stage off at temperature 1: the model's distribution as is, and no word of greedy.
    view.show_token(_first_event(SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)))
    note = view.note.text().lower()
    assert "neutral" in note and "greedy" not in note


def test_the_token_column_shows_whole_words_when_the_dock_has_room(qtbot):
    """At 1440 px the stage view's token column was 84 px: "␣atmospheric" showed as "␣atmosphe…" beside
    five half-empty stage columns. It now takes its longest token's width while each stage keeps its least."""
    from dataclasses import replace

    from app.widgets.inspection.stage_view import COLUMN_WIDTH, TOKEN_WIDTH

    ev = _first_event(SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.0))
    long_words = [" atmospheric", " transparency", " brightness", " dispersion"]
    renamed = tuple(replace(p, text=long_words[i % len(long_words)], token_bytes=None) if i < 4 else p
                    for i, p in enumerate(ev.top_model))
    ev = replace(ev, top_model=renamed)
    view = StageView()
    qtbot.addWidget(view)
    view.resize(700, 500)  # room for every column (the test platform's monospace font is wider than a desktop's)
    view.show()
    qtbot.waitExposed(view)
    view.show_token(ev)
    table = view.table
    stage_columns = table.columnCount() - 1
    assert stage_columns >= 4  # model, top-k, top-p, min-p, temperature
    assert "transparency" in " ".join(table.item(r, 0).text() for r in range(table.rowCount()))
    # What the delegate needs to draw every token name whole (the font it paints with, its margins), vs the width.
    assert table.columnWidth(0) >= table.sizeHintForColumn(0) > TOKEN_WIDTH  # "␣transparency", not "␣transpar…"
    assert all(table.columnWidth(c) >= COLUMN_WIDTH for c in range(1, table.columnCount()))
    assert table.horizontalScrollBar().maximum() == 0  # and nothing scrolls sideways

    # In a narrow dock the stage columns keep their room first; the token column goes no lower than its least.
    view.resize(300, 500)
    qtbot.wait(20)
    assert table.columnWidth(0) == TOKEN_WIDTH
