"""The new samplers in the window: a control and a tooltip for each, lists typed as text, llama.cpp JSON in and out,
the built-in presets, the stage order, and which stage removed an alternative (issue 22 item 3)."""

from __future__ import annotations

import json
import math

from engine import TokenEvent, TokenProb
from engine.events import Rewind, StageSnapshot
from PySide6.QtCore import Qt

from app.state.settings import BUILTIN_PRESETS
from app.widgets.inspection.bars import MISSING_ROLE
from app.widgets.dialogs.llamacpp_dialog import LlamaCppJsonDialog
from app.widgets.sampling.stage_order import STAGE_HELP
from app.widgets.inspection.token_detail import TokenDetail
from qt_helpers import close_window, make_window

NEW_NUMBERS = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "top_n_sigma",
               "dynatemp_range", "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target",
               "adaptive_decay", "smoothing_factor", "smoothing_curve")
NEW_TEXTS = ("dry_sequence_breakers", "logit_bias", "banned_strings")


def test_every_new_sampler_has_a_control_with_a_tooltip_and_the_panel_fits(qtbot, window):
    panel = window.sampling
    for name in NEW_NUMBERS:
        row = panel.rows[name]
        assert row.spin.toolTip() and row.label.toolTip() == row.spin.toolTip()
    for name in NEW_TEXTS:
        assert panel.groups.texts[name].toolTip()
    # Folded sections keep the panel short enough for a 1024x700 window's dock without cutting anything.
    assert all(not s.body.isVisible() for s in panel.groups.sections.values())
    assert panel.minimumWidth() <= 420
    for name in ("dry", "top_n_sigma", "logit_bias", "mirostat", "adaptive_p", "smoothing"):
        assert STAGE_HELP[name]
        assert any(panel.stage_order.list.item(i).data(Qt.ItemDataRole.UserRole) == name
                   for i in range(panel.stage_order.list.count()))


def test_new_settings_apply_and_survive_a_restart(qtbot, window, store, host):
    panel, settings = window.sampling, window.settings
    panel.groups.sections["DRY (repetition of phrases)"].header.click()
    panel.rows["dry_multiplier"].spin.setValue(0.8)
    panel.rows["top_n_sigma"].spin.setValue(0.0)  # the spin box's "off" is stored as the settings' own off
    panel.rows["adaptive_target"].spin.setValue(0.4)
    panel.rows["adaptive_target"].spin.setValue(-0.01)
    box = panel.groups.texts["logit_bias"]
    box.setPlainText('15043 = -5\n"hello" = 2\n7 = ban')
    panel.groups.texts["banned_strings"].setPlainText("shivers down\\nher spine")
    panel.flush_pending_edits()
    s = settings.options.sampler
    assert s.dry_multiplier == 0.8 and s.top_n_sigma == -1.0 and s.adaptive_target == -1.0
    assert s.logit_bias == ((15043, -5.0), ("hello", 2.0), (7, -math.inf))
    assert s.banned_strings == ("shivers down\nher spine",)
    assert "· on" in panel.groups.sections["DRY (repetition of phrases)"].header.text()
    window = _restart(qtbot, window, store, host)
    try:
        s = window.settings.options.sampler
        assert s.dry_multiplier == 0.8 and s.logit_bias[2] == (7, -math.inf)
        assert window.sampling.rows["dry_multiplier"].spin.value() == 0.8
        assert window.sampling.groups.texts["logit_bias"].toPlainText() == '15043 = -5\n"hello" = 2\n7 = ban'
    finally:
        close_window(qtbot, window)  # left open, it sits over the next test's window and takes its hover


def _restart(qtbot, window, store, host):
    close_window(qtbot, window)
    return make_window(qtbot, store, host)


def test_a_bad_logit_bias_line_is_named_and_kept_as_typed(qtbot, window):
    panel, settings = window.sampling, window.settings
    before = settings.options.sampler
    panel.groups.texts["logit_bias"].setPlainText("15043 = lots")
    panel.flush_pending_edits()
    assert settings.options.sampler == before
    assert "the bias must be a number or ban" in panel.error_label.text() and panel.error_label.isVisibleTo(panel)
    assert panel.groups.texts["logit_bias"].toPlainText() == "15043 = lots"


def test_the_new_presets_are_there_and_apply(qtbot, window):
    panel, settings = window.sampling, window.settings
    for name in ("llama.cpp defaults", "DRY + XTC creative", "Mirostat 2"):
        panel.preset_box.activated.emit(panel.preset_box.findText(name))
        assert settings.options.sampler == BUILTIN_PRESETS[name] and panel.preset_box.currentText() == name
    d = BUILTIN_PRESETS["llama.cpp defaults"]
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.penalty_last_n) == (0.8, 40, 0.95, 0.05, 64)
    assert BUILTIN_PRESETS["Mirostat 2"].mirostat == 2 and BUILTIN_PRESETS["DRY + XTC creative"].dry_multiplier > 0


def test_llamacpp_json_copies_out_and_a_pasted_setup_imports_as_a_preset(qtbot, window):
    settings = window.settings
    settings.apply_preset("DRY + XTC creative")
    dialog = LlamaCppJsonDialog(settings, window)
    shown = json.loads(dialog.text.toPlainText())
    assert shown["dry_multiplier"] == 0.8 and shown["xtc_probability"] == 0.5 and shown["samplers"][0] == "penalties"
    before = settings.options
    dialog.text.setPlainText('{"temperature": 0.9, "repeat_penalty": 1.1,')  # cut short
    assert not dialog.import_text()
    assert settings.options == before and "Not imported: this is not JSON" in dialog.notes.text()
    assert dialog.text.toPlainText().endswith("1.1,")  # what was pasted stays
    dialog.text.setPlainText(json.dumps({"temp": 0.9, "rep_pen": 1.1, "top_a": 0.2, "samplers": ["min_p", "temp"],
                                         "n_predict": 100}))
    dialog.name_edit.setText("from SillyTavern")
    assert dialog.import_text()
    s = settings.options.sampler
    assert (s.temperature, s.repetition_penalty, settings.options.max_new_tokens) == (0.9, 1.1, 100)
    assert "top_a=0.2" in dialog.notes.text() and "from SillyTavern" in settings.preset_names()
    assert window.sampling.preset_box.currentText() == "from SillyTavern"
    dialog.deleteLater()


def _event(stages, rewind=None) -> TokenEvent:
    a, b, c = TokenProb(1, "a", math.log(0.6)), TokenProb(2, "b", math.log(0.3)), TokenProb(3, "c", math.log(0.1))
    return TokenEvent(index=0, token_id=1, text="a", token_text="a", logprob=a.logprob, sampler_logprob=0.0, rank=0,
                      entropy=0.9, top_model=(a, b, c), top_sampler=(TokenProb(1, "a", 0.0),), stages=stages,
                      rewind=rewind)


def test_the_inspector_says_which_stage_removed_an_alternative(qtbot):
    a, b = TokenProb(1, "a", math.log(0.6 / 0.9)), TokenProb(2, "b", math.log(0.3 / 0.9))
    stages = (StageSnapshot("top_k", 2, 0.9, 0.6, (a, b)), StageSnapshot("min_p", 1, 0.67, 0.0, (TokenProb(1, "a", 0.0),)))
    detail = TokenDetail()
    qtbot.addWidget(detail)
    detail.show_token(_event(stages))
    cells = {detail.table.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole + 3):
             (detail.table.topLevelItem(i).data(2, MISSING_ROLE), detail.table.topLevelItem(i).toolTip(2))
             for i in range(detail.table.topLevelItemCount())}
    assert cells[3] == ("cut: top-k", "removed by top-k") and cells[2] == ("cut: min-p", "removed by min-p")
    banned = (StageSnapshot("banned_strings", 2, 0.7, 0.6, (TokenProb(1, "a", math.log(0.6 / 0.7)),
                                                            TokenProb(3, "c", math.log(0.1 / 0.7)))),)
    detail.show_token(_event(banned, Rewind("shivers down", 3, 2, "b")))
    row = next(detail.table.topLevelItem(i) for i in range(detail.table.topLevelItemCount())
               if detail.table.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole + 3) == 2)
    assert row.data(2, MISSING_ROLE) == "banned 'shivers down' here"
    assert "banned 'shivers down' here" in detail.label.text()


def test_server_samples_mode_turns_off_what_each_server_kind_cannot_take(qtbot, window):
    from engine import ModelInfo, ServerInfo

    window.settings.set_server_sampling(True)
    box = window.sampling.mode_box

    def limits(kind: str) -> dict[str, str]:
        server = ServerInfo(kind, "127.0.0.1:1", 5, False, True, False, False)
        return box.limits(ModelInfo("m", "m", "", "", 0, "", 0, 0, 0, "remote", "server", server=server, reports_top_n=5))

    llama = limits("llama.cpp")  # llama.cpp's server takes every stage it has, and the order
    assert "dry_multiplier" not in llama and "mirostat" not in llama and "order" not in llama
    assert "smoothing_factor" in llama and "banned_strings" in llama
    python = limits("llama-cpp-python")
    assert "mirostat" not in python and "logit_bias" not in python and "dry_multiplier" in python and "order" in python
    vllm = limits("vllm")
    assert "mirostat" in vllm and "no parameter" in vllm["top_n_sigma"] and "logit_bias" not in vllm
