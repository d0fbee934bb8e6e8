"""Issue 37 item 14: the window's default sampling is llama.cpp's (no repetition penalty), the CLI's is the
same object, and the Balanced preset says what it does.

Before: the window applied a repetition penalty of 1.1 (the stage view showed the user's own words pulled
down), and the CLI sampled at temperature 1.0 with every filter off.
"""

from __future__ import annotations

from engine import DEFAULT_SAMPLER, SamplerSettings
from engine.cli.main import build_parser
from engine.cli.sampling_args import resolve_sampling

from app.state.settings import BUILTIN_PRESETS, DEFAULT_PRESET, PRESET_DESCRIPTIONS, GenerationOptions, SettingsState


def test_the_default_is_llamacpps_and_the_window_and_cli_share_it():
    # common/common.h `common_params_sampling` (checked against llama.cpp's source).
    assert (DEFAULT_SAMPLER.temperature, DEFAULT_SAMPLER.top_k, DEFAULT_SAMPLER.top_p, DEFAULT_SAMPLER.min_p) == \
        (0.8, 40, 0.95, 0.05)
    assert DEFAULT_SAMPLER.repetition_penalty == 1.0  # off
    assert GenerationOptions().sampler is DEFAULT_SAMPLER
    assert BUILTIN_PRESETS[DEFAULT_PRESET] is DEFAULT_SAMPLER
    args = build_parser().parse_args(["generate", "--prompt", "x"])
    resolve_sampling(args)
    assert args.sampler == DEFAULT_SAMPLER


def test_every_builtin_preset_says_what_it_does():
    assert set(PRESET_DESCRIPTIONS) == set(BUILTIN_PRESETS)
    balanced = PRESET_DESCRIPTIONS["Balanced"]
    assert "llama.cpp" in balanced and "no repetition penalty" in balanced and "0.8" in balanced


def test_the_panel_shows_balanced_with_its_description(qtbot, window):
    panel = window.sampling
    assert window.settings.options.sampler == DEFAULT_SAMPLER
    assert panel.preset_box.currentText() == "Balanced"
    assert "no repetition penalty" in panel.preset_box.toolTip()
    i = panel.preset_box.findText("Greedy")
    assert "most likely token" in panel.preset_box.itemData(i, 3)  # Qt.ToolTipRole


def test_settings_saved_with_the_old_balanced_become_the_new_default(store):
    old = SamplerSettings(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1)
    store.put_setting(SettingsState.KEY, GenerationOptions(sampler=old).to_dict())
    assert SettingsState(store).options.sampler == DEFAULT_SAMPLER
    mine = old.with_(temperature=0.6)  # a user's own choice stays
    store.put_setting(SettingsState.KEY, GenerationOptions(sampler=mine).to_dict())
    assert SettingsState(store).options.sampler == mine
