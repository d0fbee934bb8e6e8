"""`pull`: what the user typed (a hub id, a file in a hub repo, a .gguf address) -> a model on disk to open.

Forms understood:

- `org/name`: a safetensors model (config.json + weights) is downloaded as
  the engine loads it; a repository of GGUF files with one model is that
  model, with several the error lists them by the forms below;
- `org/name:Q4_K_M`: the GGUF file whose name has that quantization;
- `org/name/file.gguf`: that file (every part of a split model);
- `https://huggingface.co/org/name/resolve/<revision>/file.gguf`: the same, through the hub;
- any other `http(s)://.../file.gguf`: downloaded into Logit Lab's models folder
  (`engine.sources.default_model.models_dir`), which the library lists.

Hub downloads go into the Hugging Face cache through huggingface_hub.

A .gguf address lands under the name its address ends with. When a file of
that name is already in the folder (another model that happens to share a
file name), `if_exists` decides: "refuse" (the default: say so and name the
choices), "keep-both" (the new one gets the first free "name (2).gguf"), or
"replace". `url_target` tells a window which file that would be, so it can
ask first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import unquote, urlsplit

from engine.errors import UsageError
from engine.library.disk import RESERVE_BYTES, FreeSpaceFn, free_bytes
from engine.library.entry import printable
from engine.library.errors import DownloadError
from engine.library.gguf_facts import split_part
from engine.library.http_download import download_url
from engine.library.hub_download import HubFile, HubRepo, endpoint, pull_files, pull_folder, repo_files
from engine.library.progress import CancelToken, ProgressFn

_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
HUB_FORM = re.compile(rf"^(?P<repo>{_REPO})(?::(?P<tag>[\w.-]+)|/(?P<file>.+\.gguf))?$", re.IGNORECASE)
HUB_HOSTS = {"huggingface.co", "hf.co", "www.huggingface.co"}
HUB_PATH = re.compile(rf"^/(?P<repo>{_REPO})/(?:resolve|blob)/(?P<rev>[^/]+)/(?P<file>.+)$")
IfExists = Literal["refuse", "keep-both", "replace"]
IF_EXISTS_CHOICES: tuple[str, ...] = get_args(IfExists)
MAX_NAME_BYTES = 255  # a file name's limit on common file systems
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/\\]")


@dataclass(frozen=True)
class PullRequest:
    kind: Literal["hub", "url"]
    repo_id: str = ""
    filename: str = ""  # a file in the repo; "" for the whole model
    tag: str = ""  # a quantization to pick among the repo's GGUF files
    revision: str | None = None
    url: str = ""


@dataclass(frozen=True)
class PullResult:
    spec: str  # what to open: a hub id or a file path
    path: Path


def parse_pull(text: str) -> PullRequest:
    """Classify what the user typed; UsageError naming the accepted forms when it is none of them."""
    text = text.strip()
    if re.match(r"^https?://", text, re.IGNORECASE):
        parts = urlsplit(text)
        hub_hosts = HUB_HOSTS | {urlsplit(endpoint()).netloc}
        m = HUB_PATH.match(unquote(parts.path))
        if parts.netloc.lower() in hub_hosts and m:
            return PullRequest("hub", m["repo"], m["file"], revision=m["rev"])
        if not unquote(parts.path).lower().endswith(".gguf"):
            raise UsageError(f"{text} does not name a .gguf file; an address can give a GGUF file, and a hub id "
                             "(org/name) gives any model")
        return PullRequest("url", url=text)
    m = HUB_FORM.match(text)
    if not m:
        raise UsageError(f"{text!r} is not something to download: give a hub id (org/name, org/name:Q4_K_M, "
                         "org/name/file.gguf) or an http(s) address of a .gguf file")
    return PullRequest("hub", m["repo"], m["file"] or "", tag=m["tag"] or "")


def url_file_name(url: str) -> str:
    """The file name a .gguf address lands under; UsageError when it is not a usable name."""
    name = Path(unquote(urlsplit(url).path)).name
    if (not name or name.startswith(".") or _UNSAFE_NAME.search(name) or len(name.encode("utf-8", "replace")) > MAX_NAME_BYTES
            or not name.lower().endswith(".gguf")):
        raise UsageError(f"{printable(url)!r} does not end in a usable .gguf file name (control characters, "
                         "slashes, a leading dot or a name over 255 bytes are refused)")
    return name


def _numbered(path: Path, n: int) -> Path:
    """"name (n).gguf"; a split model's part keeps its -0000k-of-0000N suffix last, as llama.cpp looks for it."""
    stem, part, total = split_part(path)
    suffix = f"-{part:05d}-of-{total:05d}{path.suffix}" if total > 1 else path.suffix
    return path.with_name(f"{stem} ({n}){suffix}")


def url_target(text: str, models_folder: Path | None = None) -> Path | None:
    """Where `pull(text)` would write a .gguf address (None for a hub download, which the hub cache keys by
    repository and commit, so names never collide)."""
    req = parse_pull(text)
    if req.kind != "url":
        return None
    from engine.sources.default_model import models_dir

    return (models_folder or models_dir()) / url_file_name(req.url)


def _choose_target(target: Path, if_exists: IfExists) -> Path:
    """The path to download to, given what is already there."""
    if if_exists not in IF_EXISTS_CHOICES:
        raise UsageError(f"if_exists must be one of {', '.join(IF_EXISTS_CHOICES)}, not {if_exists!r}")
    if not target.exists() or if_exists == "replace":
        return target
    if if_exists == "keep-both":
        for n in range(2, 1000):
            candidate = _numbered(target, n)
            if not candidate.exists():  # its .part, if there is one, is an earlier try of the same: resumed
                return candidate
        raise DownloadError(f"too many files named like {printable(target.name)} in {printable(str(target.parent))}")
    raise DownloadError(
        f"{printable(str(target))} already exists (another download with the same file name?); nothing was "
        "downloaded. Keep both (the new file gets a number) or replace it: --if-exists keep-both or "
        "--if-exists replace"
    )


def _models(files: list[HubFile]) -> dict[str, list[HubFile]]:
    """GGUF files grouped into models: a split model's parts are one."""
    groups: dict[str, list[HubFile]] = {}
    for f in sorted(files, key=lambda f: f.name):
        stem, _part, _total = split_part(Path(f.name))
        groups.setdefault(str(Path(f.name).parent / stem), []).append(f)
    return groups


def _choices(repo: HubRepo, groups: dict[str, list[HubFile]]) -> str:
    return ", ".join(f"{repo.repo_id}/{files[0].name}" for files in list(groups.values())[:12])


def _pick_gguf(repo: HubRepo, req: PullRequest) -> list[HubFile]:
    groups = _models(repo.gguf_files())
    if req.filename:
        stem = str(Path(req.filename).parent / split_part(Path(req.filename))[0])
        if stem not in groups:
            raise DownloadError(f"{repo.repo_id} has no file {req.filename}; it has: {_choices(repo, groups) or 'no GGUF files'}")
        return groups[stem]
    if req.tag:
        tag = req.tag.lower()
        matching = {k: v for k, v in groups.items() if re.search(rf"(^|[^a-z0-9]){re.escape(tag)}($|[^a-z0-9])", Path(k).name.lower())}
        if len(matching) == 1:
            return next(iter(matching.values()))
        listed = _choices(repo, matching or groups)
        raise DownloadError(f"{repo.repo_id} has {'several' if matching else 'no'} GGUF files named {req.tag}; choose one: {listed}")
    if len(groups) == 1:
        return next(iter(groups.values()))
    raise DownloadError(f"{repo.repo_id} holds {len(groups)} GGUF models; choose one: {_choices(repo, groups)}")


def pull(
    text: str,
    *,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
    cache_dir: Path | None = None,
    models_folder: Path | None = None,
    expected_sha256: str | None = None,
    free_space: FreeSpaceFn = free_bytes,
    reserve_bytes: int = RESERVE_BYTES,
    if_exists: IfExists = "refuse",
) -> PullResult:
    """Download what `text` names (see the module docstring); return what to open. Blocking: call it off the UI thread.

    `if_exists` ("refuse", "keep-both", "replace") decides what happens when a .gguf address's file name is
    already taken in the models folder.
    """
    req = parse_pull(text)
    cancel = cancel or CancelToken()
    common: dict[str, Any] = dict(progress=progress, cancel=cancel, free_space=free_space, reserve_bytes=reserve_bytes)
    if req.kind == "url":
        url_path = url_target(text, models_folder)
        assert url_path is not None  # a URL always names its file
        target = _choose_target(url_path, if_exists)
        path = download_url(req.url, target, expected_sha256=expected_sha256, **common)
        return PullResult(str(path), path)
    repo = repo_files(req.repo_id, req.revision)
    if not req.filename and not req.tag and repo.is_model_folder():
        folder = pull_folder(repo, cache_dir=cache_dir, **common)
        return PullResult(req.repo_id if req.revision is None else str(folder), folder)
    if not repo.gguf_files():
        raise DownloadError(f"{req.repo_id} holds neither a model folder (config.json and .safetensors) nor GGUF files")
    paths = pull_files(repo, _pick_gguf(repo, req), cache_dir=cache_dir, **common)
    return PullResult(str(paths[0]), paths[0])
