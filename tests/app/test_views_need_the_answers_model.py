"""Views that read an answer through its model refuse when another model is open (issue 43, item 4).

The layer view once recomputed SmolLM2's token ids under Gemma ("Token 3 d", rank 256029). The real window,
two mock models with distinct names (the mock model and "Mock B"), the Layers tab open on a token: loading
the other model shows the refusal in words and asks the engine for nothing; going back computes again.
The Steering tab's "Without steering" and the steering-effect colouring refuse the same way.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine import Engine
from engine.backends.mock import MockBackend

from app.controllers.engine_host import EngineHost
from app.state.models.model_match import OtherModelsAnswer, check_answer_model, made_by_other_model
from qt_helpers import MOCK_DELAY_S, close_window, make_window, run_task, send

LAYERS_CANNOT = "layer view needs a model that can show what each of its layers predicts"


def two_models(spec, backend, progress):
    """The mock model, and "mock-b": the same mock under another name (another model, as far as records go)."""
    progress("loading the mock model", 1.0)
    mock = MockBackend(delay_s=MOCK_DELAY_S)
    if spec == "mock-b":
        mock.info = dataclasses.replace(mock.info, name="Mock B", spec="mock-b")
    return Engine.from_backend(mock)


@pytest.fixture
def calls(monkeypatch):
    """Every layer capture and steering job the engine is asked for (the real calls still run)."""
    seen: list[str] = []
    for name in ("start_layer_capture", "start_steering_effect", "start_unsteered_shadow"):
        real = getattr(Engine, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            seen.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Engine, name, spy)
    return seen


@pytest.mark.slow
def test_the_layers_tab_refuses_another_models_answer(qtbot, qloop, store, calls):
    host = EngineHost(two_models)
    assert run_task(qtbot, host.load("mock", "mock"))
    w = make_window(qtbot, store, host)
    try:
        answer = send(qtbot, w, "hello")
        assert answer.model["name"] == "mock"
        w.selection.set(answer.id, 1)
        w.inspector_dock.show()
        view = w.inspector.layer_view
        w.inspector.tabs.setCurrentWidget(view)
        qtbot.waitUntil(lambda: LAYERS_CANNOT in view.status.text(), timeout=15_000)
        assert calls == ["start_layer_capture"]  # its own model: asked (the mock has no layers to show)

        assert run_task(qtbot, host.load("mock-b", "mock"))
        qtbot.waitUntil(lambda: "Open mock to see its layers" in view.status.text(), timeout=15_000)
        assert "This answer was made by mock, and Mock B is loaded" in view.status.text()
        qtbot.wait(400)  # the view's settle time and more: nothing was started meanwhile
        assert calls == ["start_layer_capture"] and view.view is None and view.table.rowCount() == 0

        w.selection.set(answer.id, 2)  # another token of the same answer: refused again, nothing asked
        qtbot.wait(400)
        assert "Open mock to see its layers" in view.status.text() and calls == ["start_layer_capture"]

        assert run_task(qtbot, host.load("mock", "mock"))  # its own model again: computed again
        qtbot.waitUntil(lambda: LAYERS_CANNOT in view.status.text(), timeout=15_000)
        assert calls == ["start_layer_capture", "start_layer_capture"]
    finally:
        close_window(qtbot, w)
        host.close()


@pytest.mark.slow
def test_steering_views_refuse_another_models_answer(qtbot, qloop, store, calls):
    host = EngineHost(two_models)
    assert run_task(qtbot, host.load("mock-b", "mock"))
    w = make_window(qtbot, store, host)
    try:
        answer = send(qtbot, w, "hello")
        conv = w.library.current
        # Written by the mock model under a steering (as an imported chat's answer would be).
        conv.update_message(answer, model={**answer.model, "name": "mock", "spec": "mock"},
                            request={**answer.request, "steering": {"vectors": [], "layers": None}})
        jobs = w.controller.steering_jobs
        with pytest.raises(OtherModelsAnswer, match="Open mock to see what steering did to it"):
            run_task(qtbot, jobs.effect(conv, answer, 1))
        with pytest.raises(OtherModelsAnswer, match="made by mock, and Mock B is loaded"):
            run_task(qtbot, jobs.shadow(conv, answer))
        assert calls == []
    finally:
        close_window(qtbot, w)
        host.close()


@pytest.mark.slow
def test_a_trace_of_another_models_answer_leaves_out_the_loaded_models_prompt_ids(qtbot, qloop, store, tmp_path):
    """File ▸ Export trace tokenizes the prompt with the loaded model: another model's ids would be the wrong ones
    (a replay of the trace runs them), so they are left out and the status line says why."""
    from app.actions.experiments import export_trace
    from engine.experiments import read_trace

    host = EngineHost(two_models)
    assert run_task(qtbot, host.load("mock", "mock"))
    w = make_window(qtbot, store, host)
    try:
        answer = send(qtbot, w, "hello")
        (own,) = read_trace(export_trace(w.context, tmp_path / "own.jsonl"))
        assert own.header["prompt_ids"]
        assert run_task(qtbot, host.load("mock-b", "mock"))
        (other,) = read_trace(export_trace(w.context, tmp_path / "other.jsonl"))
        assert other.header["prompt_ids"] is None and other.header["model"]["name"] == "mock"
        assert [e.token_id for e in other.events()] == [t.token_id for t in w.library.current.tokens(answer)]
        assert "without the prompt's token ids: the answer was made by mock" in w.status.currentMessage()
    finally:
        close_window(qtbot, w)
        host.close()


def test_what_counts_as_another_models_answer():
    loaded = {"name": "gemma-3-1b-it", "spec": "google/gemma-3-1b-it", "architecture": "gemma3", "revision": "abc"}
    smol = {"name": "SmolLM2-135M-Instruct", "spec": "default", "architecture": "llama"}
    assert made_by_other_model(smol, loaded)
    assert not made_by_other_model(dict(loaded), loaded) and not made_by_other_model(None, loaded)
    assert made_by_other_model({**loaded, "revision": "def"}, loaded)  # the same name at another commit
    assert not made_by_other_model({**loaded, "revision": ""}, loaded)  # not recorded: not a difference
    with pytest.raises(OtherModelsAnswer, match="made by SmolLM2-135M-Instruct.*Open SmolLM2-135M-Instruct to see"):
        check_answer_model(smol, loaded, "its layers")
