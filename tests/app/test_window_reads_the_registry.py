"""The window's only source of sampler labels, ranges, steps and on/off rules is the engine's stage registry, and of
backend names the engine's backend table (issue 44 item 3: one table per fact).

As tests/engine/test_stage_registry.py walks the engine's readers, this walks the window's: every number control of
every stage in the sampling panel and in an experiment column's editor shows its registry control's label, range,
step and decimals; each folding section is on exactly when the registry's `active` says the stage it switches is
on, for settings from the controls' own ranges; server-samples mode turns off exactly what the engine's server
parameters refuse; the model pickers offer the backend table's names with its help.
"""

from __future__ import annotations

import pytest
from engine import SAMPLER_CONTROLS, SamplerSettings, backend_help, user_backends
from engine.backends.remote.errors import UnsupportedByServerError
from engine.backends.remote.server_params import server_parameters
from engine.backends.select import BACKEND_TABLE
from engine.model_info import ModelInfo, ServerInfo
from engine.sampling.registry import LLAMA_CPP_SERVER, SERVER_KINDS, STAGES, StageRow
from PySide6.QtWidgets import QDoubleSpinBox, QLabel, QSpinBox

from app.widgets.experiment_windows.model_diff_view import ModelDiffView
from app.widgets.dialogs.model_picker import ModelPicker
from app.widgets.sampling.sampler_groups import SamplerGroups
from app.widgets.sampling.sampler_specs import TEXT_SECTIONS
from app.widgets.inspection.token_column import EDITED_FIELDS, SettingsEditor

NEUTRAL = SamplerSettings()
SWITCHED = [row for row in STAGES if row.switches]


def _shows_control(field: str, box: QSpinBox | QDoubleSpinBox, label: QLabel) -> None:
    c = SAMPLER_CONTROLS[field]
    assert label.text() == c.label == box.accessibleName(), field
    assert (box.minimum(), box.maximum()) == (c.minimum, c.maximum), field
    assert box.singleStep() == (max(1, int(c.step)) if c.decimals == 0 else c.step), field
    assert isinstance(box, QSpinBox) == (c.decimals == 0), field
    if isinstance(box, QDoubleSpinBox):
        assert box.decimals() == c.decimals, field
    assert box.specialValueText() == c.special, field


def test_an_experiment_columns_editor_shows_each_knob_as_the_registry_does(qtbot):
    editor = SettingsEditor(SamplerSettings())
    qtbot.addWidget(editor)
    assert set(editor.boxes) == set(EDITED_FIELDS) <= set(SAMPLER_CONTROLS)
    for field in EDITED_FIELDS:
        _shows_control(field, editor.boxes[field], editor.labels[field])
    assert editor.boxes["xtc_probability"].singleStep() == 0.01  # was 0.05 by hand against the registry's 0.01
    assert editor.settings() == SamplerSettings()  # the boxes' ranges hold every neutral value as it is


def test_the_sampling_panel_shows_every_number_control_as_the_registry_does(qtbot, window):
    rows = window.sampling.rows
    for field, c in SAMPLER_CONTROLS.items():
        if not c.lines:
            _shows_control(field, rows[field].spin, rows[field].label)


def _values(field: str) -> list[float]:
    """Values for `field` from its control: its ends, the middle of its slider, and 0 where the range holds it."""
    c = SAMPLER_CONTROLS[field]
    top = c.slider_max if c.slider_max is not None else c.maximum
    values = [c.minimum, (c.minimum + top) / 2, c.maximum] + ([0.0] if c.minimum < 0 < c.maximum else [])
    return [round(v) if c.decimals == 0 else round(v, c.decimals) for v in values]


def _variants(row: StageRow) -> list[SamplerSettings]:
    """Settings that touch only `row`'s fields: each field alone at each of its values, then each with every
    switch at each of its values (DRY's strength on with its look-back 0, which the registry calls off)."""
    numbers = [f for f in row.fields if not SAMPLER_CONTROLS[f].lines]
    changes = [{f: v} for f in numbers for v in _values(f)]
    changes += [{s: sv, f: v} for s in row.switches if s in numbers for sv in _values(s)
                for f in numbers if f != s for v in _values(f)]
    if "logit_bias" in row.fields:
        changes.append({"logit_bias": ((5, 1.5),)})
    out = [NEUTRAL]  # every stage off
    for change in changes:
        try:
            out.append(SamplerSettings(**change))
        except ValueError:  # a pair the settings refuse (they say why): not one the panel can hold either
            continue
    return out


@pytest.mark.parametrize("row", SWITCHED, ids=lambda r: r.name)
def test_each_section_is_on_exactly_when_the_registry_turns_its_stage_on(qtbot, row: StageRow):
    groups = SamplerGroups()
    qtbot.addWidget(groups)
    holding = {title for title, section in groups.sections.items()
               if any(f in groups._fields[title] for f in row.switches)}
    seen_on = seen_off = 0
    for s in _variants(row):
        groups.show_settings(s)
        for title, section in groups.sections.items():
            # On when the stage is on (its row's `active`) by a switch this section holds; every other section is off.
            expected = title in holding and row.active(s) and any(
                getattr(s, f) != getattr(NEUTRAL, f) for f in row.switches if f in groups._fields[title])
            assert section.header.text().endswith(" · on") == expected, (row.name, title, s)
            seen_on += expected
            seen_off += title in holding and not expected
    assert not holding or (seen_on and seen_off), f"{row.name}: its section was never both on and off"


def test_dry_is_off_in_its_section_when_its_look_back_is_zero_as_the_registry_says(qtbot):
    groups = SamplerGroups()
    qtbot.addWidget(groups)
    dry = groups.sections["DRY (repetition of phrases)"]
    groups.show_settings(SamplerSettings(dry_multiplier=0.8))
    assert dry.header.text().endswith(" · on")
    groups.show_settings(SamplerSettings(dry_multiplier=0.8, dry_penalty_last_n=0))  # scans nothing: off
    assert not dry.header.text().endswith(" · on")


def test_banned_strings_no_stage_turn_their_section_on(qtbot):
    groups = SamplerGroups()
    qtbot.addWidget(groups)
    title = next(t for t, names in TEXT_SECTIONS if "banned_strings" in names)
    groups.show_settings(SamplerSettings(banned_strings=("shivers",)))
    assert [t for t, sec in groups.sections.items() if sec.header.text().endswith(" · on")] == [title]


def _limits(box, kind: str) -> dict[str, str]:
    server = ServerInfo(kind, "127.0.0.1:1", 5, False, True, False, False)
    return box.limits(ModelInfo("m", "m", "", "", 0, "", 0, 0, 0, "remote", "server", server=server, reports_top_n=5))


def test_server_samples_mode_turns_off_exactly_what_the_servers_parameters_refuse(qtbot, window):
    assert all(set(row.server_defaults) <= set(row.fields) for row in STAGES)
    window.settings.set_server_sampling(True)
    box = window.sampling.mode_box
    checked: dict[str, set[bool]] = {}  # switch -> whether some kind refused it, whether some kind took it
    for kind in (*SERVER_KINDS, LLAMA_CPP_SERVER):
        limits = _limits(box, kind)
        for row in SWITCHED:
            for field in row.switches:
                for s in _variants(row):
                    if not row.active(s) or [f for f in row.fields if getattr(s, f) != getattr(NEUTRAL, f)] != [field]:
                        continue  # the stage on by this one switch alone
                    try:
                        server_parameters(s, kind, seed_supported=False)
                        refused = False
                    except UnsupportedByServerError:
                        refused = True
                    assert (field in limits) == refused, (kind, field, s)
                    checked.setdefault(field, set()).add(refused)
    switches = {f for row in SWITCHED for f in row.switches}
    assert set(checked) == switches  # every switch of every stage, on by itself at a value its control offers
    assert {f for f, seen in checked.items() if seen == {True, False}} >= {"dry_multiplier", "mirostat", "top_k"}


def test_the_model_pickers_offer_the_backend_tables_names_with_its_help(qtbot, store, host):
    picker = ModelPicker(store, None, "auto")
    qtbot.addWidget(picker)
    items = tuple(picker.backend_box.itemText(i) for i in range(picker.backend_box.count()))
    assert items == user_backends() and "mock" not in items
    assert picker.backend_box.toolTip() == backend_help("\n")
    for row in BACKEND_TABLE:
        assert (row.description in picker.backend_box.toolTip()) == row.user_facing
    view = ModelDiffView(host)
    qtbot.addWidget(view)
    items = tuple(view.backend_box.itemData(i) for i in range(view.backend_box.count()))
    assert items == user_backends(every_distribution=True)
    assert [row.name for row in BACKEND_TABLE if row.name in items] == [
        row.name for row in BACKEND_TABLE if row.user_facing and row.every_distribution]
    assert "remote" not in items  # a server's top N log-probs give no KL: Compare models cannot take one
