"""The stage view's note says what the sampler did: greedy is named as such, not as "neutral"."""

from __future__ import annotations

from engine import Engine, GenerationRequest, SamplerSettings, TokenEvent
from engine.backends.mock import MockBackend

from app.widgets.stage_view import StageView


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
