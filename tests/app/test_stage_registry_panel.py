"""The sampling panel shows a control for every stage setting the engine's registry lists (issue 32 item 3)."""

from __future__ import annotations

from engine import SAMPLER_CONTROLS, STAGE_ROWS
from PySide6.QtCore import Qt

from app.widgets.sampling.sampler_specs import OTHER_SECTION, UNPLACED


def test_the_panel_has_the_registry_control_of_every_stage_setting(qtbot, window):
    panel = window.sampling
    for field, control in SAMPLER_CONTROLS.items():
        if control.lines:
            box = panel.groups.texts[field]
            assert box.accessibleName() == control.label and box.toolTip() == control.tip
        else:
            row = panel.rows[field]
            assert row.label.text() == control.label and row.spin.toolTip() == control.tip
            assert row.spin.minimum() == control.minimum and row.spin.maximum() == control.maximum
    for spec in UNPLACED:  # a stage the layout does not place yet: its controls stand under "Other samplers"
        assert panel.groups.sections[OTHER_SECTION].isAncestorOf(panel.rows[spec.name])
    order = panel.stage_order.list
    tips = {order.item(i).data(Qt.ItemDataRole.UserRole): order.item(i).toolTip() for i in range(order.count())}
    assert tips == {name: row.help for name, row in STAGE_ROWS.items()}
