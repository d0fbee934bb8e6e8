"""What a person found clipped at 1440x900 and 1024x700 (issue 43 item 6), on the real window opened on
offscreen screens of those sizes (tests/app/layout_probe.py, one process per screen size):

- DRY opened in the Sampling panel gave it a sideways scroll bar at 1440x900 (its rows were indented 12 px
  past the panel's width);
- an invalid grammar's error quotes a long rule name, which QLabel's word wrap never breaks: the label
  widened the panel and was cut off;
- at 1024x700 the chat's title was squeezed to nothing (and the legend with it), and the inspector's last
  tab (Steering) hid behind scroll arrows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("layout_probe.py")
ROOT = Path(__file__).resolve().parents[2]


def _probe(width: int, height: int, data_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("QT_QPA_PLATFORM", None)  # the probe picks the offscreen platform with its own screen
    done = subprocess.run([sys.executable, str(PROBE), str(width), str(height), str(data_dir)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _nothing_clipped(report: dict) -> None:
    assert not report["sampling_hbar"], report  # DRY open: no sideways scroll bar
    assert report["sampling_panel_min"] <= report["sampling_viewport"], report
    assert "undefined_rule_with_a_long_name" in report["grammar_error"], report
    # The error is whole: as tall as its lines need at its width, inside its box and on screen, the panel as wide.
    assert report["grammar_error_height"] >= report["grammar_error_needs"] > 0, report
    assert report["grammar_error_width"] <= report["sampling_viewport"], report
    assert report["grammar_error_inside_box"] and report["grammar_error_on_screen"], report
    assert not report["sampling_hbar_after_error"], report
    assert report["title_width"] >= report["title_needs"], report  # at least a dozen characters of the title
    assert report["legend_shown"] and report["legend_width"] >= 100, report
    assert report["inspector_tab_arrows"] == 0 and report["inspector_tabs_inside"], report  # Steering in view
    assert report["status_inside"] and all(report["status_labels_whole"].values()), report


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1440, 900), (1024, 700)], ids=["1440x900", "1024x700"])
def test_nothing_a_person_uses_is_clipped(tmp_path, size):
    _nothing_clipped(_probe(*size, tmp_path / "data"))
