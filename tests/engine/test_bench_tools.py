"""bench/tools.py --quick on the default model (SmolLM2 GGUF on llama.cpp): the figures' lines are printed, each
once, with values in range. The figures themselves are not asserted beyond what holds on any machine: the
constraint's calls are always well formed (1.00), shares lie in [0, 1], a speed ratio is positive, and the
confidence's cost is a small positive time (the bench's own goals, ratio >= 0.9 and < 1 ms, depend on the
machine's load and are reported, not asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

ROOT = Path(__file__).resolve().parents[2]
LINES = ("well_formed_with_constraint", "well_formed_without", "called_when_none_fits", "ratio_tools_vs_plain",
         "ratio_tools_vs_same_prompt", "confidence_ms_per_call")


@pytest.mark.slow
@pytest.mark.model
def test_quick_bench_prints_each_figure_in_range() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "tools.py"), "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    values: dict[str, list[float]] = {}
    for name, value in re.findall(r"^([a-z_]+)=([-0-9.]+)$", out.stdout, re.M):
        values.setdefault(name, []).append(float(value))
    assert all(len(values.get(n, [])) == 1 for n in LINES), out.stdout
    figure = {n: values[n][0] for n in LINES}
    assert figure["well_formed_with_constraint"] == 1.0  # the grammar allows no other call
    assert 0.0 <= figure["well_formed_without"] <= 1.0
    assert 0.0 <= figure["called_when_none_fits"] <= 1.0
    assert 0.0 < figure["ratio_tools_vs_plain"] < 10.0 and 0.0 < figure["ratio_tools_vs_same_prompt"] < 10.0
    # --quick's required pass makes 4 calls with the grammar and 4 without (their opener forced): both defined.
    assert 0.0 < figure["confidence_ms_per_call"] < 50.0
    assert re.search(r"^machine=.* threads=1 .*prompts=5 ", out.stdout, re.M), out.stdout
