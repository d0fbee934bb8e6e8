"""The sampling panel loses no edit, whatever is clicked next; presets show the user's own names."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QStyle, QStyleOptionSpinBox

from app.state.settings import BUILTIN_PRESETS, SettingsState


def _click_up_arrow(qtbot, spin) -> None:
    """Click the spin box's up arrow where the style draws it."""
    option = QStyleOptionSpinBox()
    spin.initStyleOption(option) if hasattr(spin, "initStyleOption") else option.initFrom(spin)
    rect = spin.style().subControlRect(QStyle.ComplexControl.CC_SpinBox, option, QStyle.SubControl.SC_SpinBoxUp, spin)
    qtbot.mouseClick(spin, Qt.MouseButton.LeftButton, pos=rect.center())


def test_stop_strings_typed_just_before_another_click_are_kept(qtbot, window):
    panel, settings = window.sampling, window.settings
    before = settings.options.max_new_tokens
    panel.stop_edit.setFocus()
    qtbot.keyClicks(panel.stop_edit, "60")
    qtbot.keyClick(panel.stop_edit, Qt.Key.Key_Return)
    qtbot.keyClicks(panel.stop_edit, "END")
    _click_up_arrow(qtbot, panel.max_tokens.spin)  # well within the 0.4 s the box waits for more typing
    assert settings.options.max_new_tokens == before + 1
    qtbot.wait(600)
    assert panel.stop_edit.toPlainText() == "60\nEND"
    assert settings.options.stop == ("60", "END")
    assert window.store.get_setting("generation_options")["stop"] == ["60", "END"]


def test_stop_strings_are_kept_when_a_slider_or_a_preset_changes_next(qtbot, window):
    panel, settings = window.sampling, window.settings
    panel.stop_edit.setFocus()
    qtbot.keyClicks(panel.stop_edit, "###")
    panel.rows["temperature"].spin.setValue(0.3)  # another control, without focus changing
    panel.preset_box.activated.emit(panel.preset_box.findText("Creative"))
    qtbot.wait(600)
    assert settings.options.stop == ("###",) and panel.stop_edit.toPlainText() == "###"
    assert settings.options.sampler == BUILTIN_PRESETS["Creative"]


def test_stop_strings_typed_just_before_the_window_closes_are_saved(qtbot, window):
    from qt_helpers import close_window

    panel = window.sampling
    panel.stop_edit.setFocus()
    qtbot.keyClicks(panel.stop_edit, "bye")
    store = window.store
    close_window(qtbot, window)
    assert store.get_setting("generation_options")["stop"] == ["bye"]


def test_tab_in_the_stop_strings_moves_focus_and_types_nothing(qtbot, window):
    panel, settings = window.sampling, window.settings
    panel.stop_edit.setFocus()
    qtbot.keyClicks(panel.stop_edit, "60")
    qtbot.keyClick(panel.stop_edit, Qt.Key.Key_Tab)
    qtbot.wait(600)
    assert "\t" not in panel.stop_edit.toPlainText()
    assert not panel.stop_edit.hasFocus()
    assert settings.options.stop == ("60",)


def test_reset_right_after_typing_resets_the_stop_strings(qtbot, window):
    """Reset means reset: the typed text is not brought back after it."""
    panel, settings = window.sampling, window.settings
    panel.stop_edit.setFocus()
    qtbot.keyClicks(panel.stop_edit, "zzz")
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.wait(600)
    assert settings.options.stop == () and panel.stop_edit.toPlainText() == ""


def test_a_preset_saved_with_a_builtins_values_shows_the_users_name(qtbot, window):
    panel, settings = window.sampling, window.settings
    panel.preset_box.activated.emit(panel.preset_box.findText("Greedy"))
    assert panel.preset_box.currentText() == "Greedy"
    assert panel.save_preset("Deterministic")
    assert panel.preset_box.currentText() == "Deterministic" and panel.delete_preset_button.isEnabled()
    # ...after a restart too.
    assert SettingsState(window.store).matching_preset() == "Deterministic"
    # Choosing the built-in shows the built-in.
    panel.preset_box.activated.emit(panel.preset_box.findText("Greedy"))
    assert panel.preset_box.currentText() == "Greedy" and not panel.delete_preset_button.isEnabled()
    assert SettingsState(window.store).matching_preset() == "Greedy"


def test_a_preset_may_hold_length_and_stop_strings_when_asked(qtbot, window):
    panel, settings = window.sampling, window.settings
    settings.update_sampler(temperature=0.5)
    settings.set_max_new_tokens(77)
    settings.set_stop(["END"])
    assert panel.save_preset("Short answers", include_length_and_stop=True)
    assert panel.save_preset("Warm", include_length_and_stop=False)

    settings.reset()
    panel.preset_box.activated.emit(panel.preset_box.findText("Short answers"))
    assert settings.options.sampler.temperature == 0.5
    assert (settings.options.max_new_tokens, settings.options.stop) == (77, ("END",))
    assert panel.stop_edit.toPlainText() == "END" and panel.max_tokens.value() == 77
    assert panel.preset_box.currentText() == "Short answers"

    settings.reset()
    panel.preset_box.activated.emit(panel.preset_box.findText("Warm"))  # sampler only: length and stop stay
    assert settings.options.sampler.temperature == 0.5
    assert (settings.options.max_new_tokens, settings.options.stop) == (512, ())
    # Stored the old way (a bare sampler), a preset still reads.
    assert SettingsState(window.store).preset("Warm").temperature == 0.5


def test_the_save_dialog_asks_for_a_name_and_whether_to_include_length_and_stop(qtbot, window, monkeypatch):
    from app.widgets.sampling.save_preset_dialog import SavePresetDialog

    dialog = SavePresetDialog(window.sampling)
    qtbot.addWidget(dialog)
    assert not dialog.include_length_and_stop.isChecked()
    assert not dialog.ok_button.isEnabled()  # no name yet
    qtbot.keyClicks(dialog.name_edit, "  Mine  ")
    dialog.include_length_and_stop.setChecked(True)
    assert dialog.ok_button.isEnabled()
    assert dialog.choice() == ("Mine", True)

    monkeypatch.setattr(SavePresetDialog, "ask", staticmethod(lambda parent, names, model="": ("Via button", True, False)))
    window.settings.set_stop(["STOP"])
    qtbot.mouseClick(window.sampling.save_preset_button, Qt.MouseButton.LeftButton)
    assert window.sampling.preset_box.currentText() == "Via button"
    assert window.settings.preset_entry("Via button").stop == ("STOP",)
