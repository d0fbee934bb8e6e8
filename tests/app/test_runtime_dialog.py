"""Model ▸ Runtime settings…: the loaded model reloads with the context, threads and batch size chosen, they are
remembered for it and used when it opens again; a setting the model cannot take is disabled with the engine's reason;
settings that stop a model from loading can be dropped from the error dialog."""

from __future__ import annotations

import pytest
from qt_helpers import close_window, make_window, run_task

pytest.importorskip("llama_cpp")


@pytest.fixture
def tiny_gguf_file(tmp_path):
    from tiny_gguf import write_tiny_llama_gguf

    return str(write_tiny_llama_gguf(tmp_path / "tiny.gguf", n_ctx=4096))


@pytest.fixture
def real_host():
    from app.controllers.engine_host import EngineHost, start_engine

    host = EngineHost(start_engine)  # the production factory: settings travel as they do in the app
    yield host
    host.close()


def _dialog_settings(dialog, **values):
    for name, value in values.items():
        dialog.spins[name].setValue(value)


def test_runtime_settings_reload_the_model_and_apply_when_it_opens_again(qtbot, qloop, store, real_host, tiny_gguf_file):
    import llama_cpp

    from engine import RuntimeSettings

    from app.state.models.runtime_choices import saved_runtime

    window = make_window(qtbot, store, real_host)
    try:
        assert run_task(qtbot, window.models.load(tiny_gguf_file, "auto"), 30000)
        info = real_host.info
        assert info.context_length == 4096 and info.runtime.kv_cache_bytes == 4096 * 256
        assert "/ 4,096 · KV 1.0 MiB" in window.status.context_label.text()

        window.menu_actions.runtime_settings.trigger()
        dialog = window.models.dialog
        assert dialog is not None and dialog.objectName() == "runtime_dialog" and dialog.isVisible()
        for name in ("n_ctx", "n_threads", "n_threads_batch", "n_batch"):
            assert dialog.spins[name].isEnabled(), name
            assert dialog.spins[name].text() == "automatic"
        assert dialog.findChild(type(dialog.cache_label), "n_ctx_now").text() == "now 4,096"
        assert dialog.spins["n_ctx"].maximum() == 4096  # never longer than the model's own
        if not llama_cpp.llama_supports_gpu_offload():  # this machine: the GPU layers are not for it, said why
            assert not dialog.spins["n_gpu_layers"].isEnabled()
            assert "CPU only" in dialog.reasons["n_gpu_layers"].text()
        _dialog_settings(dialog, n_ctx=512, n_threads=1, n_batch=64)
        assert "KV cache at 512 tokens: 128.0 KiB" in dialog.cache_label.text()
        dialog.accept()
        qtbot.waitUntil(lambda: real_host.loading, timeout=5000)
        qtbot.waitUntil(lambda: not real_host.loading, timeout=30000)
        info = real_host.info
        assert info.context_length == 512 and info.runtime.in_use.n_threads == 1 and info.runtime.in_use.n_batch == 64
        assert "/ 512 · KV 128.0 KiB" in window.status.context_label.text()
        assert saved_runtime(store, tiny_gguf_file, "auto") == RuntimeSettings(n_ctx=512, n_threads=1, n_batch=64)
    finally:
        close_window(qtbot, window)

    # The next start opens the last model again, with the settings chosen for it.
    from app.controllers.engine_host import EngineHost, start_engine

    real_host.close()
    real_host = EngineHost(start_engine)
    window = make_window(qtbot, store, real_host)
    try:
        assert run_task(qtbot, window.models.start(), 30000)
        assert real_host.info.context_length == 512 and real_host.info.runtime.in_use.n_batch == 64
        # "All automatic" forgets them: the model's own context again.
        dialog = window.models.open_runtime_dialog()
        assert dialog.spins["n_ctx"].value() == 512
        dialog.reset()
        assert dialog.settings() == RuntimeSettings()
        dialog.accept()
        qtbot.waitUntil(lambda: real_host.loading, timeout=5000)
        qtbot.waitUntil(lambda: not real_host.loading, timeout=30000)
        assert real_host.info.context_length == 4096
        assert saved_runtime(store, tiny_gguf_file, "auto") == RuntimeSettings()
    finally:
        close_window(qtbot, window)
        real_host.close()


def test_settings_that_stop_a_model_from_loading_can_be_dropped_from_the_error(qtbot, qloop, store, real_host,
                                                                               tiny_gguf_file):
    from PySide6.QtWidgets import QPushButton

    from engine import RuntimeSettings

    from app.state.models.runtime_choices import remember_runtime, saved_runtime

    remember_runtime(store, tiny_gguf_file, "auto", RuntimeSettings(n_ctx=100_000))  # longer than the file's 4,096
    window = make_window(qtbot, store, real_host)
    try:
        assert run_task(qtbot, window.models.load(tiny_gguf_file, "auto"), 30000) is False
        box = window.models.error_box
        assert "longer than the model's own (4,096)" in box.text()
        assert "your runtime settings: context length 100000" in box.informativeText()
        box.findChild(QPushButton, "load_with_defaults").click()
        qtbot.waitUntil(lambda: real_host.info is not None, timeout=30000)
        assert real_host.info.context_length == 4096
        assert saved_runtime(store, tiny_gguf_file, "auto") == RuntimeSettings()
    finally:
        close_window(qtbot, window)


def test_a_model_that_takes_no_runtime_settings_says_why_in_the_dialog(qtbot, window):
    """The mock model (as a torch, MLX or server model) takes none: every setting is disabled with the engine's
    reason, and there is nothing to reload with."""
    from engine import RuntimeSettings

    dialog = window.models.open_runtime_dialog()
    assert dialog is not None
    for name in RuntimeSettings.names():
        assert not dialog.spins[name].isEnabled()
        assert "settings of llama.cpp models" in dialog.reasons[name].text()
    assert not dialog.reload_button.isEnabled()
    assert "KV" not in window.status.context_label.text()  # nothing known, nothing claimed
    dialog.reject()


def test_a_torch_model_on_the_cpu_takes_threads_from_the_dialog(qtbot, qloop, store, real_host, tiny_llama_folder):
    """torch takes the threads (held for every answer) and says why the rest are not its settings."""
    import torch

    from engine import RuntimeSettings

    from app.state.models.runtime_choices import saved_runtime

    before = torch.get_num_threads()
    spec = str(tiny_llama_folder)
    window = make_window(qtbot, store, real_host)
    try:
        assert run_task(qtbot, window.models.load(spec, "torch"), 60000)
        dialog = window.models.open_runtime_dialog()
        assert dialog is not None and dialog.spins["n_threads"].isEnabled()
        assert dialog.reload_button.isEnabled()
        for name in ("n_ctx", "n_threads_batch", "n_gpu_layers", "n_batch"):
            assert not dialog.spins[name].isEnabled(), name
            assert "torch chooses it" in dialog.reasons[name].text()
        _dialog_settings(dialog, n_threads=1)
        dialog.accept()
        qtbot.waitUntil(lambda: real_host.loading, timeout=5000)
        qtbot.waitUntil(lambda: not real_host.loading, timeout=60000)
        assert real_host.info.backend == "torch" and real_host.info.runtime.in_use.n_threads == 1
        assert saved_runtime(store, spec, "torch") == RuntimeSettings(n_threads=1)
    finally:
        close_window(qtbot, window)
        torch.set_num_threads(before)
