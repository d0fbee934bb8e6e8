"""The Hugging Face hub cache: one folder per repository, snapshots per commit, files linked to blobs.

Layout (huggingface_hub's, `HF_HUB_CACHE`):

    models--<org>--<name>/refs/main              the commit hash "main" pointed to when last downloaded
    models--<org>--<name>/snapshots/<commit>/... the files of that commit (links into blobs/ on Linux/macOS)
    models--<org>--<name>/blobs/<etag>           the content; `<etag>.incomplete` while downloading

The snapshot `refs/main` names is the one listed (else the newest), so a
repository downloaded at several commits is one model. A snapshot with
config.json and .safetensors is opened by its hub id (the engine finds it in
the cache, offline); each .gguf file in it is a model of its own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.library.safe_read import Unreadable, read_small_text
from engine.library.walk import find_models

log = logging.getLogger(__name__)

REPO_PREFIX = "models--"
MAX_REF_BYTES = 256  # refs/main holds one commit hash


@dataclass(frozen=True)
class CachedModel:
    repo_id: str
    kind: Literal["gguf", "folder"]
    path: Path  # the .gguf file in the snapshot, or the snapshot folder
    spec: str  # what Open passes to the engine


def repo_id_of(folder_name: str) -> str:
    """"models--org--name" -> "org/name"."""
    return folder_name.removeprefix(REPO_PREFIX).replace("--", "/")


def current_snapshot(repo: Path) -> tuple[Path | None, bool]:
    """(the snapshot folder to list, whether refs/main names it)."""
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    try:
        commit = read_small_text(ref, MAX_REF_BYTES, "commit reference").strip()
    except Unreadable as e:
        if ref.exists() or ref.is_symlink():  # a missing ref is usual (a download by commit); anything else is said
            log.warning("%s %s; listing the newest snapshot instead", ref, e)
        commit = ""
    if commit and "/" not in commit and "\\" not in commit and commit not in (".", "..") and (snapshots / commit).is_dir():
        return snapshots / commit, True
    try:
        with os.scandir(snapshots) as it:
            folders = [Path(e.path) for e in it if _is_dir(e)]
    except OSError:
        return None, False
    if not folders:
        return None, False
    return max(folders, key=_mtime), False


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _mtime(folder: Path) -> float:
    try:
        return folder.stat().st_mtime
    except OSError:
        return 0.0


def cached_models(cache: Path) -> list[CachedModel]:
    """The models in a hub cache folder (datasets and spaces are skipped)."""
    out: list[CachedModel] = []
    try:
        with os.scandir(cache) as it:
            repos = sorted((Path(e.path) for e in it if e.name.startswith(REPO_PREFIX) and _is_dir(e)), key=lambda p: p.name)
    except OSError:
        return out
    for repo in repos:
        snapshot, is_main = current_snapshot(repo)
        if snapshot is None:
            continue
        repo_id = repo_id_of(repo.name)
        for found in find_models(snapshot):
            if found.kind == "gguf":
                out.append(CachedModel(repo_id, "gguf", found.path, str(found.path)))
            elif found.path == snapshot:
                out.append(CachedModel(repo_id, "folder", snapshot, repo_id if is_main else str(snapshot)))
            else:  # a model folder inside the repository (some repos keep variants in subfolders)
                out.append(CachedModel(repo_id, "folder", found.path, str(found.path)))
    return out
