"""bench/gpu_figures.py, the one command for the GPU figures, runs end to end on the CPU with --quick.

Builds a tiny random-weight Llama with the default model's tokenizer (read
from the GGUF, no hub), measures decode against generate(), the weights
floor and the loom, and prints the three figures the GPU run reports.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
@pytest.mark.model
def test_gpu_figures_quick_on_the_cpu(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_figures

    figures = gpu_figures.main(["--quick", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "same tokens as generate(): yes" in out
    for name in ("ratio_vs_generate", "floor_fraction", "device_chain_speedup", "loom_speedup", "shared_batch_speedup"):
        printed = re.findall(rf"^{name}=([0-9.]+)$", out, re.MULTILINE)
        assert len(printed) == 1, out
        assert math.isfinite(figures[name]) and figures[name] > 0
        assert float(printed[0]) == pytest.approx(figures[name], abs=0.01)
    assert "random weights built" in out and "tiny: 6M parameters" in out
    assert sys.modules["gpu_figures"] is gpu_figures
