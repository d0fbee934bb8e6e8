"""Hub ids (`org/name`): use the local HF cache if it has the model, else download it.

Downloading is real code for users with a network. Where the hub cannot be
reached the error names the spec and says so within seconds: the metadata
request has a short timeout and we never retry in a loop.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import HubUnreachableError, ModelNotFoundError

if TYPE_CHECKING:
    from tqdm.auto import tqdm

    from engine.sources.progress import ProgressCallback

log = logging.getLogger(__name__)

# What a causal LM folder needs; skips other formats (.bin, .pt, .onnx, .gguf) that would multiply the download.
# *.py: a model's own code, fetched so that --trust-remote-code can run it; it is never run unless allowed
# (engine.sources.remote_code).
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.py"]
COMMIT = re.compile(r"^[0-9a-f]{40}$")
METADATA_TIMEOUT_S = 8.0


def download(repo_id: str, progress: ProgressCallback | None = None) -> Path:
    """Return a local folder holding `repo_id`, downloading what is missing."""
    import huggingface_hub

    try:  # a complete earlier download works offline and instantly
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except Exception:
        pass
    if progress:
        progress(f"downloading {repo_id}", None)
    with hub_errors(repr(repo_id), "pass a local folder or .gguf file"):
        # A metadata call with a short timeout first: snapshot_download's own
        # calls use the library's longer defaults, which on a black-holed
        # network would look like a hang.
        huggingface_hub.HfApi().model_info(repo_id, timeout=METADATA_TIMEOUT_S)
        path = huggingface_hub.snapshot_download(
            repo_id,
            allow_patterns=ALLOW_PATTERNS,
            etag_timeout=METADATA_TIMEOUT_S,
            tqdm_class=_progress_tqdm(progress) if progress else None,
        )
    return Path(path)


def revision_of(folder: Path) -> str:
    """The commit hash a hub snapshot folder holds ('' when `folder` is not a hub snapshot).

    huggingface_hub keeps every download in `.../snapshots/<commit>/`, so the
    folder `download` returns names exactly which weights were loaded, online or not.
    """
    folder = Path(folder)
    return folder.name if folder.parent.name == "snapshots" and COMMIT.match(folder.name) else ""


@contextmanager
def hub_errors(what: str, alternative: str) -> Iterator[None]:
    """Turn huggingface_hub's many failure types into our errors, each naming `what` and what to do instead."""
    from huggingface_hub import errors as hf_errors

    try:
        yield
    except hf_errors.RepositoryNotFoundError as e:
        raise ModelNotFoundError(f"no model {what} on the hub (or it is private/gated)") from e
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled) as e:
        raise HubUnreachableError(
            f"cannot download {what}: the hub cannot be reached and there is no local copy "
            f"(check the network, or {alternative})"
        ) from e
    except hf_errors.HfHubHTTPError as e:
        raise HubUnreachableError(f"cannot download {what}: the hub answered {e}") from e
    except Exception as e:  # DNS failure, refused or timed-out connection (httpx errors vary by version)
        raise HubUnreachableError(
            f"cannot download {what}: the hub cannot be reached ({type(e).__name__}); "
            f"check the network, or {alternative}"
        ) from e


def _progress_tqdm(progress: ProgressCallback) -> type[tqdm]:
    """A tqdm subclass that reports byte progress to our callback instead of a terminal."""
    from tqdm.auto import tqdm

    class _Reporting(tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            out = super().update(n)
            if self.total:
                progress(self.desc or "downloading", min(1.0, self.n / self.total))
            return out

    return _Reporting
