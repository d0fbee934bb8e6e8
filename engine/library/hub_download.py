"""Hub downloads through huggingface_hub's own code, into the Hugging Face cache, with our progress and checks.

Before anything is fetched, one metadata request with a short timeout says
whether the hub answers and what the files weigh (free space is checked
against that); then huggingface_hub downloads (resuming its `.incomplete`
blobs), and each large file's SHA-256 is compared with the one the hub
publishes for it (`lfs.sha256`). A mismatch deletes the blob, so the next
pull fetches it again; so does a .gguf shorter than its own header says it
is (engine.library.gguf_whole), which a listing and a checksum made of the
same short file would let through.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import HubUnreachableError, ModelNotFoundError
from engine.library.disk import RESERVE_BYTES, FreeSpaceFn, check_space, disk_full_error, free_bytes, is_disk_full
from engine.library.errors import ChecksumMismatchError, DownloadError
from engine.library.gguf_whole import gguf_shortfall, is_gguf_name
from engine.library.hub_progress import ProgressTracker
from engine.library.locations import hf_hub_cache
from engine.library.progress import CancelToken, ProgressFn
from engine.printable import printable
from engine.sources.hub import ALLOW_PATTERNS, METADATA_TIMEOUT_S, hub_errors

log = logging.getLogger(__name__)

ALTERNATIVE = "open a model that is already on this machine (Model ▸ Library)"


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    sha256: str  # "" for small files the hub keeps in git (no published SHA-256)


@dataclass(frozen=True)
class HubRepo:
    repo_id: str
    commit: str
    files: tuple[HubFile, ...]
    revision: str = "main"  # the branch or tag asked for; refs/<revision> records its commit in the cache

    def gguf_files(self) -> list[HubFile]:
        return [f for f in self.files if f.name.lower().endswith(".gguf") and not Path(f.name).name.lower().startswith("mmproj")]

    def is_model_folder(self) -> bool:
        names = {f.name for f in self.files}
        return "config.json" in names and any(n.endswith(".safetensors") for n in names)


def endpoint() -> str:
    """HF_ENDPOINT read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """huggingface_hub's failures become one sentence; ours (cancel, disk full, checksum) pass through as they are."""
    from huggingface_hub import errors as hf_errors

    try:
        yield
    except DownloadError:
        raise
    except hf_errors.HfHubHTTPError as e:
        if isinstance(e, hf_errors.RepositoryNotFoundError):  # gated repositories too
            with hub_errors(what, ALTERNATIVE):
                raise e
        if isinstance(e, hf_errors.RevisionNotFoundError):
            raise ModelNotFoundError(f"the hub has {what} but not that revision (branch, tag or commit)") from e
        if isinstance(e, hf_errors.EntryNotFoundError):
            raise ModelNotFoundError(f"the hub has no file {what}") from e
        status = e.response.status_code if e.response is not None else "no status"
        # huggingface_hub's own message spans lines and links; one line is what the user needs.
        raise HubUnreachableError(f"cannot download {what}: the hub answered HTTP {status}; try again later") from e
    except OSError as e:
        if is_disk_full(e):
            raise disk_full_error(hf_hub_cache(), f"the download of {what}") from e
        with hub_errors(what, ALTERNATIVE):
            raise e
    except Exception as e:
        with hub_errors(what, ALTERNATIVE):
            raise e


def repo_files(repo_id: str, revision: str | None = None) -> HubRepo:
    """The repository's files with sizes and published SHA-256s (one request, short timeout)."""
    from huggingface_hub import HfApi

    with _errors(repr(repo_id)):
        info = HfApi(endpoint=endpoint()).model_info(
            repo_id, revision=revision, files_metadata=True, timeout=METADATA_TIMEOUT_S
        )
    files = []
    for s in info.siblings or []:
        if not _safe_name(s.rfilename):  # it would be shown on a terminal and become a path in the cache
            log.warning("%s lists a file whose name cannot be used here: %r; left out", repo_id, s.rfilename)
            continue
        lfs = getattr(s, "lfs", None)
        sha = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", "")) or ""
        files.append(HubFile(s.rfilename, int(s.size or 0), sha))
    return HubRepo(repo_id, info.sha or "", tuple(files), revision or "main")


def _safe_name(name: object) -> bool:
    """A repository file name that is plain text and stays inside the repository's folder."""
    if not isinstance(name, str) or not name or printable(name) != name or "\\" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _record_ref(cache: Path, repo: HubRepo) -> None:
    """refs/<revision> -> commit, as snapshot_download writes it: the cache then opens the hub id offline."""
    if not repo.commit or repo.revision == repo.commit:
        return
    ref = cache / ("models--" + repo.repo_id.replace("/", "--")) / "refs" / repo.revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.tmp")
        tmp.write_text(repo.commit)
        os.replace(tmp, ref)
    except OSError as e:
        log.warning("cannot record %s's %s in the hub cache: %s", repo.repo_id, repo.revision, e)


def _delete(path: Path) -> None:
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)


def _verify(path: Path, expected: HubFile) -> None:
    """The file is whole: the size the hub's metadata gives, and its SHA-256 where the hub publishes one."""
    size = path.stat().st_size
    if expected.size and size != expected.size:
        _delete(path)
        raise DownloadError(
            f"{expected.name} came out {size:,} bytes long, but the hub lists it at {expected.size:,}: it was "
            "deleted; pull again"
        )
    if is_gguf_name(expected.name) and (short := gguf_shortfall(path)):
        # The hub's listing and checksum describe the file it holds; a copy cut short there matches both.
        _delete(path)
        raise DownloadError(f"{expected.name} is incomplete: its GGUF header says so ({short}). It was deleted, "
                            "not kept in the cache; the hub's copy is damaged, so try another file or later")
    if not expected.sha256:
        return
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    if h.hexdigest() != expected.sha256:
        _delete(path)
        raise ChecksumMismatchError(
            f"{expected.name} is damaged: its SHA-256 is {h.hexdigest()[:16]}…, the hub publishes "
            f"{expected.sha256[:16]}…. It was deleted; pull again"
        )


def _missing_bytes(cache: Path, repo: HubRepo, files: list[HubFile]) -> int:
    snapshot = cache / ("models--" + repo.repo_id.replace("/", "--")) / "snapshots" / repo.commit
    return sum(f.size for f in files if not (snapshot / f.name).is_file())


def pull_files(
    repo: HubRepo,
    files: list[HubFile],
    *,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
    cache_dir: Path | None = None,
    free_space: FreeSpaceFn = free_bytes,
    reserve_bytes: int = RESERVE_BYTES,
) -> list[Path]:
    """Download `files` of `repo` at its commit into the hub cache; return their snapshot paths."""
    from huggingface_hub import hf_hub_download

    cache = Path(cache_dir) if cache_dir else hf_hub_cache()
    cancel = cancel or CancelToken()
    what = files[0].name if len(files) == 1 else repo.repo_id
    check_space(cache, _missing_bytes(cache, repo, files), free_space, reserve_bytes, what)
    tracker = ProgressTracker(what, sum(f.size for f in files), progress, cancel, cache, free_space, reserve_bytes)
    paths = []
    with _errors(repr(f"{repo.repo_id}/{what}" if len(files) == 1 else repo.repo_id)):
        for f in files:
            cancel.check(what)
            path = Path(hf_hub_download(
                repo.repo_id, f.name, revision=repo.commit or None, cache_dir=cache, endpoint=endpoint(),
                etag_timeout=METADATA_TIMEOUT_S, tqdm_class=tracker.tqdm_class,
            ))
            _verify(path, f)
            tracker.file_done(f.size)
            paths.append(path)
    _record_ref(cache, repo)
    return paths


def pull_folder(repo: HubRepo, **kw: Any) -> Path:  # kw: pull_files' keywords
    """Download a safetensors model (the files the engine loads: hub.ALLOW_PATTERNS); return its snapshot folder."""
    wanted = sorted((f for f in repo.files if any(fnmatch.fnmatch(f.name, p) for p in ALLOW_PATTERNS)),
                    key=lambda f: f.size)  # small files first: config and tokenizer arrive at once
    paths = pull_files(repo, wanted, **kw)
    snapshot = paths[0]
    for _ in Path(wanted[0].name).parts:  # snapshots/<commit>/<name>: up as many levels as the name has
        snapshot = snapshot.parent
    return snapshot

