"""The runtime settings dialog takes its ranges from RuntimeSettings.range(): one table for the window and the CLI
(issue 36 item 4). The dialog had its own copy (context from 256 where the engine takes 1)."""

from __future__ import annotations

import pytest

from engine import ModelInfo, RuntimeSettings
from engine import runtime_settings
from engine.runtime_settings import RuntimeFacts

from app.widgets.dialogs.runtime_dialog import RuntimeDialog


def _dialog(qtbot, trained_context: int = 0) -> RuntimeDialog:
    facts = RuntimeFacts(in_use=RuntimeSettings(n_ctx=2048), trained_context=trained_context,
                         takes=RuntimeSettings.names())
    info = ModelInfo("tiny", "tiny", "", "", 0, "", 0, 0, 0, "llama.cpp", "tiny.gguf", runtime=facts)
    dialog = RuntimeDialog(info, RuntimeSettings())
    qtbot.addWidget(dialog)
    return dialog


def test_every_spin_box_spans_exactly_the_engines_range(qtbot):
    dialog = _dialog(qtbot)
    for name in RuntimeSettings.names():
        low, high = RuntimeSettings.range(name)
        spin = dialog.spins[name]
        assert (spin.minimum(), spin.maximum()) == (low - 1, high), name  # one below the lowest: automatic
        for value in (low, high):  # the ends the dialog offers, the engine takes ...
            spin.setValue(value)
            assert getattr(dialog.settings(), name) == value
        for outside in (low - 1, high + 1):  # ... and what it refuses, the dialog cannot offer
            with pytest.raises(ValueError):
                RuntimeSettings(**{name: outside})
        spin.setValue(spin.minimum())
        assert getattr(dialog.settings(), name) is None and spin.text() == "automatic"


def test_the_dialog_follows_a_change_to_the_engines_table(qtbot, monkeypatch):
    monkeypatch.setitem(runtime_settings.RANGES, "n_batch", (8, 1024))
    monkeypatch.setitem(runtime_settings.RANGES, "n_ctx", (64, 100_000))
    dialog = _dialog(qtbot)
    assert (dialog.spins["n_batch"].minimum(), dialog.spins["n_batch"].maximum()) == (7, 1024)
    assert (dialog.spins["n_ctx"].minimum(), dialog.spins["n_ctx"].maximum()) == (63, 100_000)


def test_the_context_is_still_capped_at_the_models_own(qtbot):
    dialog = _dialog(qtbot, trained_context=8192)
    assert dialog.spins["n_ctx"].maximum() == 8192
