"""The sampling panel: invalid values cannot get in; order, presets and reset reach the state."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from engine import DEFAULT_ORDER

from app.state.settings import BUILTIN_PRESETS, GenerationOptions


def _type(qtbot, widget, text: str) -> None:
    widget.setFocus()
    widget.selectAll()
    qtbot.keyClicks(widget, text)
    qtbot.keyClick(widget, Qt.Key.Key_Return)


def test_invalid_setting_values_are_rejected(qtbot, window):
    panel, settings = window.sampling, window.settings
    before = settings.options

    # Spin boxes refuse what their range forbids: letters, a minus sign where values are >= 0, too large.
    temperature = panel.rows["temperature"].spin
    _type(qtbot, temperature, "abc")
    assert temperature.value() == before.sampler.temperature
    _type(qtbot, temperature, "-3")
    # A negative temperature is clamped to the box's minimum, 0 (greedy), and what the box shows is what is saved.
    assert temperature.value() == 0.0 and temperature.text() == "0 (greedy)"
    assert settings.options.sampler.temperature == 0.0
    top_p = panel.rows["top_p"].spin
    _type(qtbot, top_p, "7")
    assert 0 < settings.options.sampler.top_p <= 1 and top_p.value() <= 1

    # The seed field takes digits only.
    qtbot.mouseClick(panel.random_seed, Qt.MouseButton.LeftButton)  # fix the seed
    assert not panel.random_seed.isChecked()
    panel.seed_edit.clear()
    qtbot.keyClicks(panel.seed_edit, "12a-3x")
    assert panel.seed_edit.text() == "123"
    qtbot.keyClick(panel.seed_edit, Qt.Key.Key_Return)
    assert settings.options.sampler.seed == 123

    # A value that slips past a widget is refused by the state: nothing changes, the reason is shown.
    state_before = settings.options
    panel.rows["xtc_threshold"].edited.emit("xtc_threshold", 0.9)
    assert settings.options == state_before
    assert panel.error_label.isVisible() and "xtc_threshold" in panel.error_label.text()
    assert panel.rows["xtc_threshold"].spin.value() == pytest.approx(state_before.sampler.xtc_threshold)
    with pytest.raises(ValueError, match="top_p"):
        settings.update_sampler(top_p=0.0)
    with pytest.raises(ValueError, match="max new tokens"):
        settings.set_max_new_tokens(0)
    with pytest.raises(ValueError):
        GenerationOptions(stop=("",))
    assert settings.options == state_before

    # A valid edit clears the message and is stored.
    panel.rows["min_p"].spin.setValue(0.1)
    assert not panel.error_label.isVisible()
    assert settings.options.sampler.min_p == pytest.approx(0.1)
    assert window.store.get_setting("generation_options")["sampler"]["min_p"] == pytest.approx(0.1)


def test_stage_order_presets_and_reset(qtbot, window):
    panel, settings = window.sampling, window.settings
    order = panel.stage_order
    # Untick temperature: the stage leaves the chain.
    item = next(order.list.item(i) for i in range(order.list.count()) if order.list.item(i).text() == "temperature")
    item.setCheckState(Qt.CheckState.Unchecked)
    assert "temperature" not in settings.options.sampler.order
    # Move top-p above top-k with the keyboard-accessible button (llama.cpp's order has typical-p between them).
    order.list.setCurrentRow([order.list.item(i).text() for i in range(order.list.count())].index("top-p"))
    qtbot.mouseClick(order.up, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(order.up, Qt.MouseButton.LeftButton)
    got = settings.options.sampler.order
    assert got.index("top_p") < got.index("top_k")

    assert panel.preset_box.currentText() == "Custom"
    assert panel.save_preset("Mine")
    assert panel.preset_box.currentText() == "Mine" and panel.delete_preset_button.isEnabled()
    with pytest.raises(ValueError):
        settings.delete_preset("Greedy")
    greedy = panel.preset_box.findText("Greedy")
    panel.preset_box.activated.emit(greedy)
    assert settings.options.sampler == BUILTIN_PRESETS["Greedy"]
    assert panel.rows["temperature"].spin.text() == "0 (greedy)"
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert settings.options == GenerationOptions()
    assert settings.options.sampler.order == DEFAULT_ORDER
    assert panel.preset_box.currentText() == "Balanced"
    panel.preset_box.activated.emit(panel.preset_box.findText("Mine"))
    assert "temperature" not in settings.options.sampler.order
