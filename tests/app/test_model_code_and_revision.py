"""A model folder with its own code is run only after the user confirmed the named files; answers keep the revision."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from engine import Engine
from engine.backends.mock import MockBackend

from app.controllers.engine_host import EngineHost, start_engine
from app.state.database.store import Store
from app.widgets.dialogs.model_picker import ModelPicker
from qt_helpers import close_window, make_window, run_task, send


def code_folder(tmp_path: Path) -> Path:
    """A folder whose config asks transformers to import its own modules (an architecture transformers lacks)."""
    folder = tmp_path / "custom-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "logitlab_test_arch",
        "auto_map": {"AutoConfig": "configuration_my.MyConfig", "AutoModelForCausalLM": "modeling_my.MyForCausalLM"},
    }))
    for name in ("configuration_my.py", "modeling_my.py"):
        (folder / name).write_text("raise SystemExit('this code must not run')\n")
    return folder


def test_picker_names_the_code_files_and_never_preapproves_them(qtbot, store, tmp_path):
    folder = code_folder(tmp_path)
    picker = ModelPicker(store, None, "auto")
    qtbot.addWidget(picker)
    assert picker.trust_box.isHidden() and not picker.trust_remote_code  # the default model ships no code
    picker.spec_box.setCurrentText(str(folder))
    assert not picker.trust_box.isHidden()
    assert "configuration_my.py, modeling_my.py" in picker.trust_box.text()
    assert not picker.trust_remote_code  # shown, not ticked
    picker.trust_box.setChecked(True)
    assert picker.trust_remote_code
    picker.spec_box.setCurrentText("default")
    assert picker.trust_box.isHidden() and not picker.trust_remote_code


def test_refused_model_code_is_confirmed_by_name_then_loaded_with_permission(qtbot, qloop, store, tmp_path):
    folder = code_folder(tmp_path)
    asked: list[tuple[str | None, bool]] = []

    def factory(spec, backend, progress, trust_remote_code=False):
        asked.append((spec, trust_remote_code))
        if trust_remote_code:  # allowed: stand in for the model the folder's code would build
            return Engine.from_backend(MockBackend())
        return start_engine(spec, backend, progress)  # the real engine, which refuses

    host = EngineHost(factory)
    w = make_window(qtbot, store, host)
    try:
        assert run_task(qtbot, w.models.load(str(folder), "torch")) is False
        box = w.models.error_box
        assert box.objectName() == "remote_code_confirmation" and box.isVisible()
        assert "configuration_my.py" in box.text() and "modeling_my.py" in box.text()
        assert asked == [(str(folder), False)] and host.info is None
        box.allow_button.click()
        qtbot.waitUntil(lambda: host.info is not None and not host.loading, timeout=10000)
        assert asked[-1] == (str(folder), True)
    finally:
        close_window(qtbot, w)
        host.close()


def test_each_answer_saves_the_revision_of_the_weights(qtbot, qloop, store, db_path):
    commit = "0123456789abcdef0123456789abcdef01234567"

    def factory(spec, backend, progress):
        backend_ = MockBackend(delay_s=0.001)
        backend_.info = replace(backend_.info, revision=commit)  # as load_model records a hub id's snapshot
        return Engine.from_backend(backend_)

    host = EngineHost(factory)
    assert run_task(qtbot, host.load("org/model", "auto"))
    w = make_window(qtbot, store, host)
    try:
        answer = send(qtbot, w, "the cat")
        assert answer.model["revision"] == commit
        fresh = Store(db_path)
        try:
            assert fresh.messages(w.library.current.id)[1].model["revision"] == commit
        finally:
            fresh.close()
    finally:
        close_window(qtbot, w)
        host.close()
