"""Ollama's store: manifests name models, blobs hold them.

Layout (`~/.ollama/models`, or `$OLLAMA_MODELS`):

    manifests/<registry host>/<namespace>/<model>/<tag>   JSON, one per name:tag
    blobs/sha256-<hex>                                     content-addressed files

A manifest is an OCI image manifest: {"schemaVersion": 2, "mediaType": ...,
"config": {...}, "layers": [{"mediaType", "digest", "size"}, ...]}. The
layer with mediaType `application/vnd.ollama.image.model` is the GGUF
weights; its digest "sha256:<hex>" is the blob `sha256-<hex>` (older
versions on Linux and macOS wrote `sha256:<hex>`). Models Ollama imported
from safetensors keep tensors as separate layers (`...image.tensor`): no
single GGUF file to open, so they are not listed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from engine.library.safe_read import Unreadable, is_regular_file, read_json

log = logging.getLogger(__name__)

MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True)
class OllamaModel:
    name: str  # as `ollama list` shows it: "llama3.2:3b", "hf.co/org/repo:Q4_K_M"
    blob: Path
    problem: str = ""  # set when the manifest cannot be used (missing blob, unreadable JSON)


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    if host == DEFAULT_REGISTRY:
        return f"{model}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _children(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError:
        return []


def blob_path(root: Path, digest: str) -> Path:
    hexdigest = digest.split(":", 1)[-1]
    dashed = root / "blobs" / f"sha256-{hexdigest}"
    if dashed.exists():
        return dashed
    colon = root / "blobs" / f"sha256:{hexdigest}"
    return colon if colon.exists() else dashed


def read_manifest(path: Path, root: Path, name: str) -> OllamaModel | None:
    """The model in one manifest file; None when it holds no GGUF layer (a safetensors import, an adapter)."""
    try:
        manifest = read_json(path, MAX_MANIFEST_BYTES, "Ollama manifest")
    except Unreadable as e:
        return OllamaModel(name, path, f"the Ollama manifest {path} {e}")
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        return OllamaModel(name, path, f"the Ollama manifest {path} has no list of layers")
    for layer in layers:
        if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER and isinstance(layer.get("digest"), str):
            digest = layer["digest"]
            if "/" in digest or "\\" in digest or "\0" in digest or len(digest) > 200:  # must name a file in blobs/
                return OllamaModel(name, path, f"the Ollama manifest {path} names a blob that is not a digest")
            blob = blob_path(root, digest)
            if not blob.exists():
                return OllamaModel(name, blob, f"Ollama's manifest for {name} names {blob.name}, which is missing")
            if not is_regular_file(blob):
                return OllamaModel(name, blob, f"Ollama's blob {blob.name} for {name} is not a regular file")
            return OllamaModel(name, blob)
    log.debug("%s has no GGUF layer; not listed", path)
    return None


def ollama_models(root: Path) -> list[OllamaModel]:
    """Every name:tag in an Ollama store with its GGUF blob (four fixed levels: no recursion, no link loops)."""
    found = []
    for host in _children(root / "manifests"):
        for namespace in _children(Path(host.path)):
            for model in _children(Path(namespace.path)):
                for tag in _children(Path(model.path)):
                    try:
                        if tag.is_dir():
                            continue
                    except OSError:
                        pass  # read_manifest says what is wrong with it
                    name = display_name(host.name, namespace.name, model.name, tag.name)
                    entry = read_manifest(Path(tag.path), root, name)
                    if entry is not None:
                        found.append(entry)
    return found
