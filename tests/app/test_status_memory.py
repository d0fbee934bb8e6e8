"""The status bar's memory is the loaded model's own (issue 43 item 6).

Going back from Gemma 3 to SmolLM2 it stayed at 2.0-2.2 GiB (0.47 before): it showed the process's
resident memory, which keeps what an earlier model used, and the tooltip's "peak during the last answer"
was the process's lifetime peak, never reset when the model changed. The window here loads a large and
then a small model (the mock backend with the sizes a GGUF's weights and KV cache would have).
"""

from __future__ import annotations

from dataclasses import replace

from qt_helpers import close_window, make_window, run_task

from engine import Engine
from engine.backends.mock import MockBackend
from engine.runtime_settings import RuntimeFacts, RuntimeSettings

from app.controllers.engine_host import EngineHost
from app.widgets.fmt import human_bytes
from app.widgets.status_bar import resident_bytes

GiB, MiB = 2**30, 2**20
SIZES = {"big": (1900 * MiB, 300 * MiB), "small": (400 * MiB, 80 * MiB)}  # weights, KV cache


class _SizedMock(MockBackend):
    def __init__(self, weights: int, kv: int, peak: int):
        super().__init__(delay_s=0.0)
        self.info = replace(self.info, name=f"mock {weights // MiB} MiB", bytes=weights,
                            runtime=RuntimeFacts(in_use=RuntimeSettings(n_ctx=4096), kv_cache_bytes=kv))
        self._peak = peak

    def peak_memory_bytes(self) -> int:
        return self._peak


def _factory(spec, backend, progress):
    weights, kv = SIZES[spec]
    return Engine.from_backend(_SizedMock(weights, kv, peak=3 * GiB if spec == "big" else 0))


def test_memory_follows_the_loaded_model_and_forgets_the_last_ones_peak(qtbot, qloop, store):
    host = EngineHost(_factory)
    try:
        assert run_task(qtbot, host.load("big", "mock"))
        window = make_window(qtbot, store, host, max_new_tokens=4)
        label = window.status.memory_label
        assert label.text() == f"memory {human_bytes(SIZES['big'][0] + SIZES['big'][1])}"  # 2.1 GiB
        window.on_send("the cat")
        qtbot.waitUntil(lambda: "Peak reported for the last answer: 3.0 GiB" in label.toolTip(), timeout=10000)

        assert run_task(qtbot, host.load("small", "mock"))  # back to the small model
        qtbot.waitUntil(lambda: window.status.model_label.text().startswith("mock 400 MiB"))
        assert label.text() == "memory 480.0 MiB"  # its weights and KV cache, whatever the process still holds
        tip = label.toolTip()
        assert "model weights 400.0 MiB + KV cache 80.0 MiB" in tip
        assert "Peak" not in tip  # the big model's peak says nothing about this one
        assert "The app's resident memory now" in tip and resident_bytes() > 0
        close_window(qtbot, window)
    finally:
        host.close()


def test_a_model_of_unknown_size_shows_the_apps_memory(qtbot, window):
    assert window.host.info.bytes == 0  # the plain mock model: no weights to count
    assert window.status.memory_label.text().startswith("app memory ")
