"""Download one file over HTTP(S): progress, cancel, resume with Range, free-space checks, SHA-256 check.

Bytes go to `<target>.part`; only a complete file whose checksum matches is
renamed to `<target>`, so a model folder never holds half a model under its
real name. A dropped connection is retried from where it stopped (`Range:
bytes=N-`), a few times; after that, or after a cancel, the part stays and
the next call resumes it. A server that ignores Range (200 instead of 206)
sends the whole file again, so the part is restarted.

The checksum is the one the caller gives, else one the server publishes:
`Repr-Digest: sha-256=:<base64>:` (RFC 9530), `Digest: SHA-256=<base64>`,
`X-Checksum-Sha256`, or an ETag that is a SHA-256 (how the Hugging Face hub
names large files).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.library.disk import RESERVE_BYTES, FreeSpaceFn, check_space, disk_full_error, free_bytes, is_disk_full
from engine.library.errors import ChecksumMismatchError, DownloadError, DownloadInterrupted
from engine.library.progress import CancelToken, DownloadProgress, ProgressFn, RateMeter, format_bytes

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.1  # reports at most this often (and for the first and last bytes): a window redraws each
SPACE_CHECK_EVERY = 16 * 2**20
RETRIES = 5  # resumptions per call after a dropped connection
RETRY_PAUSE_S = 0.5
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class _Attempt:
    """What one response said."""

    total: int | None
    published_sha256: str


def published_sha256(headers: httpx.Headers) -> str:
    """The SHA-256 a server publishes for the body, lower-case hex; "" when none."""
    for name in ("repr-digest", "digest"):
        for item in headers.get(name, "").split(","):
            algo, _, value = item.strip().partition("=")
            if algo.strip().lower() == "sha-256" and value:
                try:
                    return base64.b64decode(value.strip().strip(":")).hex()
                except ValueError:
                    pass
    for name in ("x-checksum-sha256", "x-linked-etag", "etag"):
        value = headers.get(name, "").strip().removeprefix("W/").strip('"')
        if _HEX64.match(value):
            return value.lower()
    return ""


def _total_from(response: httpx.Response, offset: int) -> int | None:
    if response.status_code == 206:
        _, _, total = response.headers.get("content-range", "").rpartition("/")
        if total.strip().isdigit():
            return int(total)
    length = response.headers.get("content-length")
    if length and length.isdigit():
        return int(length) + (offset if response.status_code == 206 else 0)
    return None


def _http_error(url: str, response: httpx.Response) -> DownloadError:
    code = response.status_code
    if code == 404:
        return DownloadError(f"nothing to download at {url} (HTTP 404 not found): check the address")
    if code in (401, 403):
        return DownloadError(f"{url} refused the download (HTTP {code}): the file is private or needs a login")
    return DownloadError(f"the server at {url} answered HTTP {code} {response.reason_phrase}; try again later")


def _hash_existing(part: Path, offset: int) -> "hashlib._Hash":
    h = hashlib.sha256()
    with part.open("rb") as f:
        remaining = offset
        while remaining > 0:
            block = f.read(min(1 << 22, remaining))
            if not block:
                break
            h.update(block)
            remaining -= len(block)
    return h


def download_url(
    url: str,
    target: Path,
    *,
    expected_sha256: str | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
    free_space: FreeSpaceFn = free_bytes,
    reserve_bytes: int = RESERVE_BYTES,
    retries: int = RETRIES,
    client: httpx.Client | None = None,
) -> Path:
    """Download `url` to `target`; return `target`. Raises a DownloadError subclass saying what went wrong."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    cancel = cancel or CancelToken()
    meter = RateMeter()
    own_client = client is None
    client = client or httpx.Client(
        follow_redirects=True, timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    )
    try:
        failures = 0
        while True:
            cancel.check(target.name)
            offset = part.stat().st_size if part.exists() else 0
            try:
                attempt, digest = _fetch(client, url, part, offset, cancel, meter, progress, target.name,
                                         free_space, reserve_bytes)
                break
            except (httpx.TransportError, _Dropped) as e:
                received = (part.stat().st_size if part.exists() else 0) - offset
                if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)) and offset == 0 and received <= 0:
                    raise DownloadError(f"cannot reach {httpx.URL(url).host}: {e or type(e).__name__}; check the address "
                                        "and the network") from e
                failures += 1  # a bounded number per call: a later pull resumes again
                if failures > retries:
                    have = part.stat().st_size if part.exists() else 0
                    raise DownloadInterrupted(
                        f"the download of {target.name} was interrupted ({type(e).__name__}) after "
                        f"{format_bytes(have)}; the part is kept in {part.parent}: pull again to resume"
                    ) from e
                log.warning("download of %s dropped (%s); resuming", url, type(e).__name__)
                time.sleep(RETRY_PAUSE_S)
        size = part.stat().st_size
        if attempt.total is not None and size != attempt.total:
            raise DownloadInterrupted(
                f"the download of {target.name} ended at {format_bytes(size)} of {format_bytes(attempt.total)}; "
                "pull again to resume"
            )
        want = (expected_sha256 or attempt.published_sha256).lower()
        got = digest.hexdigest()
        if want and got != want:
            part.unlink(missing_ok=True)
            raise ChecksumMismatchError(
                f"{target.name} is damaged: its SHA-256 is {got[:16]}…, but {want[:16]}… was published for it. "
                "The file was deleted; try again (if it happens again, the server's copy is damaged)"
            )
        part.replace(target)
        log.info("downloaded %s (%s, sha256 %s%s)", target, format_bytes(size), got[:12], " checked" if want else "")
        return target
    finally:
        if own_client:
            client.close()


class _Dropped(Exception):
    """The body ended before Content-Length said it would (a dropped connection on some servers)."""


def _fetch(client: httpx.Client, url: str, part: Path, offset: int, cancel: CancelToken, meter: RateMeter,
           progress: ProgressFn | None, what: str, free_space: FreeSpaceFn, reserve: int) -> tuple[_Attempt, "hashlib._Hash"]:
    """One GET from `offset`: append to `part`; return what the response said and the SHA-256 so far."""
    headers = {"Range": f"bytes={offset}-", "Accept-Encoding": "identity"} if offset else {"Accept-Encoding": "identity"}
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code == 416 and offset:
            _, _, total = response.headers.get("content-range", "").rpartition("/")
            if total.strip() == str(offset):  # the part is already whole (an earlier run stopped before renaming)
                return _Attempt(offset, published_sha256(response.headers)), _hash_existing(part, offset)
            part.unlink(missing_ok=True)  # the file changed on the server: start over
            raise _Dropped("range not satisfiable")
        if response.status_code >= 400:
            raise _http_error(url, response)
        if offset and response.status_code != 206:
            log.info("%s ignored the Range request; starting again from the first byte", url)
            offset = 0
        total = _total_from(response, offset)
        attempt = _Attempt(total, published_sha256(response.headers))
        if total is not None:
            check_space(part.parent, total - offset, free_space, reserve, what)
        h = _hash_existing(part, offset) if offset else hashlib.sha256()
        done, unchecked, reported = offset, 0, 0.0
        try:
            with part.open("r+b" if offset else "wb") as f:
                f.seek(offset)
                f.truncate()
                # Chunks as they arrive (no re-buffering): a dropped connection loses nothing received,
                # and cancel is seen after each network read.
                for chunk in response.iter_bytes():
                    cancel.check(what)
                    f.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    unchecked += len(chunk)
                    if unchecked >= SPACE_CHECK_EVERY:
                        f.flush()
                        check_space(part.parent, (total - done) if total else 0, free_space, reserve, what)
                        unchecked = 0
                    now = time.monotonic()
                    if progress and (now - reported >= PROGRESS_EVERY_S or done == total):
                        reported = now
                        progress(DownloadProgress(what, done, total, meter.add(done)))
        except OSError as e:
            if is_disk_full(e):
                raise disk_full_error(part.parent, f"the download of {what}") from e
            raise
        if total is not None and done < total:
            raise _Dropped(f"{done} of {total} bytes")
    return attempt, h
