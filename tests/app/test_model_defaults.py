"""A model's own defaults (issue 48 item 4): saved where presets are saved, applied when that model is opened
and said so in words, kept by a reopened database, nonsense stored values named and ignored, and "Use the
global defaults" going back. On the real window with the mock backend (its spec and backend identify it)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.controllers.engine_host import EngineHost
from engine import Engine
from engine.backends.mock import MockBackend
from app.state.models.model_defaults import DEFAULTS_KEY, model_key, read_defaults
from app.state.database.store import Store
from qt_helpers import MOCK_DELAY_S, run_task

LOADS: list[dict] = []  # the runtime settings each load of the mock model was given


@pytest.fixture
def host():
    """The mock model, taking the runtime settings (a context length) the window loads it with, as a file's does."""
    def factory(spec, backend, progress, **runtime):
        LOADS.append(runtime)
        return Engine.from_backend(MockBackend(delay_s=MOCK_DELAY_S))

    LOADS.clear()
    h = EngineHost(factory)
    yield h
    h.close()


def _reopen(qtbot, window) -> None:
    """Open the loaded model again as Model ▸ Open model… does (the window's own load)."""
    assert run_task(qtbot, window.models.load(window.host.spec, window.host.backend))


def test_a_models_saved_defaults_are_applied_when_it_opens_and_kept_by_the_database(qtbot, window, db_path):
    panel, settings, host = window.sampling, window.settings, window.host
    window.library.current.set_system_prompt("Answer in French.")
    settings.apply_preset("Creative")
    assert panel.save_preset("Mine", False, True)  # Save… with "Save as this model's defaults" ticked
    n_ctx = host.info.context_length
    settings.apply_preset("Greedy")  # the user goes on with another preset
    window.new_chat()
    _reopen(qtbot, window)
    assert settings.matching_preset() == "Mine" and LOADS[-1] == {"n_ctx": n_ctx}
    assert window.library.current.system_prompt == "Answer in French."  # the empty chat takes its prompt
    assert window.status.currentMessage() == (
        f"{host.info.name}: its saved defaults applied (preset Mine, context {n_ctx}, its system prompt)")

    other = Store(db_path)  # what the next start reads
    try:
        defaults, problems = read_defaults(other, host.spec, host.backend, ["Mine"])
        assert (defaults.preset, defaults.n_ctx, defaults.system_prompt, problems) == (
            "Mine", n_ctx, "Answer in French.", [])
    finally:
        other.close()

    # Use the global defaults: the options before the model's were applied come back, its defaults forgotten.
    qtbot.mouseClick(panel.global_defaults_button, Qt.MouseButton.LeftButton)
    assert settings.matching_preset() == "Greedy"
    assert window.status.currentMessage() == f"{host.info.name}: its saved defaults forgotten; the global defaults are in use"
    settings.apply_preset("Precise") if "Precise" in settings.preset_names() else settings.apply_preset("Balanced")
    chosen = settings.matching_preset()
    _reopen(qtbot, window)
    assert settings.matching_preset() == chosen and LOADS[-1] == {}  # nothing applied any more
    assert "saved defaults" not in window.status.currentMessage()


def test_nonsense_saved_defaults_are_said_in_words_and_ignored(qtbot, window):
    settings, host = window.settings, window.host
    settings.apply_preset("Greedy")
    window.store.put_setting(DEFAULTS_KEY, {model_key(host.spec, host.backend): {
        "model": host.info.name, "preset": "Deleted long ago", "n_ctx": -5, "system_prompt": 12}})
    _reopen(qtbot, window)
    assert settings.matching_preset() == "Greedy" and LOADS[-1] == {}  # no context of -5 asked for
    assert window.library.current.system_prompt == ""
    assert window.status.currentMessage() == (
        f"{host.info.name}: none of its saved defaults applied; ignored: the preset 'Deleted long ago' is not there "
        "any more; a context length of -5 is not a number of tokens; the saved system prompt is not text")


def test_the_save_dialog_offers_the_loaded_models_defaults_only_with_a_model(qtbot):
    from app.widgets.sampling.save_preset_dialog import SavePresetDialog

    with_model = SavePresetDialog(None, [], "SmolLM2-135M-Instruct")
    without = SavePresetDialog(None, [])
    qtbot.addWidget(with_model)
    qtbot.addWidget(without)
    assert with_model.for_model.text() == "Save as this model's defaults (SmolLM2-135M-Instruct)"
    assert not with_model.for_model.isHidden() and without.for_model.isHidden()
