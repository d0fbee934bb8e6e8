"""Model specs: what the user typed, resolved to a local folder transformers and mlx-lm can load."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.errors import ModelNotFoundError
from engine.sources import gguf_convert, hub
from engine.sources.default_model import DEFAULT_NAME, default_model_path
from engine.sources.progress import ProgressCallback


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SourceKind = Literal["default", "folder", "gguf", "hub", "url"]
URL = re.compile(r"^https?://", re.IGNORECASE)


@dataclass(frozen=True)
class ModelSource:
    """A spec after resolution: what kind of thing it names and where it is."""

    spec: str
    kind: SourceKind
    path: Path | None  # None for a hub id until downloaded
    name: str


def resolve_spec(spec: str | Path | None) -> ModelSource:
    """Classify `spec` without loading anything; raise ModelNotFoundError if it names nothing."""
    if spec is None or str(spec).strip() in ("", "default"):
        path = default_model_path()
        return ModelSource("default", "default", path, DEFAULT_NAME)
    text = str(spec).strip()
    if URL.match(text):  # an OpenAI-compatible server: http://host:port/v1[#model-name]
        base, _, model = text.partition("#")
        host = base.rstrip("/").split("//", 1)[-1].rpartition("@")[2]  # never the credentials a URL may hold
        return ModelSource(text, "url", None, model or host)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but has no config.json: not a Hugging Face model folder")
        return ModelSource(text, "folder", path.resolve(), path.name)
    if path.is_file():
        # Ollama keeps GGUF files as content-addressed blobs without the extension: the magic decides.
        if path.suffix.lower() != ".gguf" and not _starts_with_gguf_magic(path):
            raise ModelNotFoundError(f"{path} is a file but not a .gguf model (give a .gguf file or a model folder)")
        return ModelSource(text, "gguf", path.resolve(), path.stem)
    looks_like_path = text.startswith((".", "/", "~")) or "\\" in text or text.lower().endswith(".gguf")
    if HUB_ID.match(text) and not looks_like_path:
        return ModelSource(text, "hub", None, text.split("/")[-1])
    raise ModelNotFoundError(f"model not found: {text!r} is neither an existing folder, a .gguf file nor a hub id (org/name)")


def _starts_with_gguf_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == gguf_convert.GGUF_MAGIC
    except OSError:
        return False


def materialize(source: ModelSource, progress: ProgressCallback | None = None) -> Path:
    """A local Hugging Face folder for `source`: converting GGUF once, downloading hub ids."""
    if source.kind in ("default", "gguf"):
        assert source.path is not None
        return gguf_convert.ensure_converted(source.path, progress)
    if source.kind == "url":
        raise ValueError(f"{source.spec} is a server, not a local model: it is opened by the remote backend")
    if source.kind == "hub":
        return hub.download(source.spec, progress)
    assert source.path is not None
    return source.path
