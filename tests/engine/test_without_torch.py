"""The default install has no torch: the window starts, the default model runs on llama.cpp, and a Hugging Face
model is refused with what to install.

Each check runs in a child process in which torch, transformers, accelerate
and safetensors cannot be imported (an import hook raises as a missing
package does), since this process has them imported already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WITHOUT_TORCH = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {"torch", "transformers", "accelerate", "safetensors"}

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    """
)


def _run_without_torch(code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH + textwrap.dedent(code)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_the_blocker_hides_torch():
    out = _run_without_torch("""
        import importlib.util
        try:
            import torch
        except ModuleNotFoundError:
            print("no torch")
        from engine.backends.select import torch_available
        print("available", torch_available())
    """)
    assert out.returncode == 0, out.stderr
    assert "no torch" in out.stdout and "available False" in out.stdout


@pytest.mark.slow
def test_the_window_module_imports_without_torch():
    out = _run_without_torch("""
        import app.__main__, engine
        print("loaded", sorted(m for m in ("torch", "transformers", "accelerate") if m in sys.modules))
    """)
    assert out.returncode == 0, out.stderr
    assert "loaded []" in out.stdout


@pytest.mark.slow
@pytest.mark.model
def test_the_default_model_answers_on_llamacpp_without_torch():
    out = _run_without_torch("""
        from engine import Engine, GenerationRequest, SamplerSettings
        with Engine.load() as eng:
            request = GenerationRequest(prompt="The capital of France is", sampler=SamplerSettings(temperature=0),
                                        max_new_tokens=3)
            done = list(eng.generate(request))[-1]
        print("text", repr(done.stats.text), "error", done.stats.error)
        print("torch imported", "torch" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr
    assert "error None" in out.stdout and "torch imported False" in out.stdout
    assert "Paris" in out.stdout


@pytest.mark.slow
def test_a_hugging_face_folder_says_how_to_add_torch(tmp_path):
    folder = tmp_path / "some-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    out = _run_without_torch(f"""
        from engine.backends.select import BackendNotInstalledError
        from engine.errors import ModelLoadError
        from engine.open_model import load_model
        from app.controllers.engine_host import describe_error
        try:
            load_model({str(folder)!r})
        except BackendNotInstalledError as e:
            assert isinstance(e, ModelLoadError)
            print("refused:", describe_error(e))
    """)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout
    assert "pip install 'logitlab[torch]'" in out.stdout
    assert "Traceback" not in out.stderr
