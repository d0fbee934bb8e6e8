"""Download one file over HTTP(S): progress, cancel, resume with Range, free-space checks, SHA-256 check.

Bytes go to `<target>.part`; only a complete file whose checksum matches is
renamed to `<target>`, so a model folder never holds half a model under its
real name. A dropped connection is retried from where it stopped (`Range:
bytes=N-`), a few times; after that, or after a cancel, the part stays and
the next call resumes it. A server that ignores Range (200 instead of 206)
sends the whole file again, so the part is restarted.

The checksum is the one the caller gives, else one the server publishes:
`Repr-Digest: sha-256=:<base64>:` (RFC 9530), `Digest: SHA-256=<base64>`,
`X-Checksum-Sha256`, `X-Linked-Etag` (the hub's redirect to its CDN) or an
ETag that is a SHA-256 (how the Hugging Face hub names large files).

A file gets its name only when it is verifiably whole. Its length comes from
the server (Content-Length, Content-Range's total, the hub's `X-Linked-Size`,
which must agree with each other and across resumes); a body that ends
without any of them (a connection closed early looks the same as the end) is
checked with one more request for the bytes after it (`416 */size` confirms
the size, `206` means there is more). Without a checksum that same check is
made after every download, so a server whose Content-Length is too short is
caught too. A 206 that starts elsewhere than asked is never appended; a
body longer than the size is refused. A .gguf must also reach as far as its
own header says (engine.library.gguf_whole): a server that stands by a short
length, or serves a cut-off file honestly, is caught there, and the short
file is deleted instead of named. Redirects: at most `MAX_REDIRECTS`,
and only to http(s).
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
from engine.library.gguf_whole import gguf_shortfall, is_gguf_name
from engine.library.progress import CancelToken, DownloadProgress, ProgressFn, RateMeter, format_bytes

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.1  # reports at most this often (and for the first and last bytes): a window redraws each
SPACE_CHECK_EVERY = 16 * 2**20
RETRIES = 5  # resumptions per call after a dropped connection
RETRY_PAUSE_S = 0.5
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
MAX_REDIRECTS = 10
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class _Attempt:
    """What one response said."""

    total: int | None
    published_sha256: str
    framed: bool = False  # the body's end is marked (Content-Length or chunked), not just a closed connection


@dataclass
class _Expected:
    """What the server said about the whole file, kept across resumes: a later answer must agree."""

    total: int | None = None
    sha256: str = ""


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


def _all_headers(response: httpx.Response) -> list[httpx.Headers]:
    """The final response's headers, then the redirects' (the hub says X-Linked-Size/-Etag on its redirect)."""
    return [response.headers, *(r.headers for r in reversed(response.history))]


def _published(response: httpx.Response) -> str:
    return next((sha for sha in map(published_sha256, _all_headers(response)) if sha), "")


def _linked_size(response: httpx.Response) -> int | None:
    for headers in _all_headers(response):
        value = headers.get("x-linked-size", "").strip()
        if value.isdigit():
            return int(value)
    return None


def _content_range(response: httpx.Response) -> tuple[int, int | None] | None:
    """(first byte, total or None) of a 206's Content-Range; None when it has none that parses."""
    m = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
    if not m:
        return None
    return int(m[1]), None if m[3] == "*" else int(m[3])


def _total_from(response: httpx.Response, offset: int, what: str) -> int | None:
    """The whole file's size as this response states it (every statement must agree); None when it does not say."""
    said: dict[str, int] = {}
    if response.status_code == 206:
        rng = _content_range(response)
        if rng is not None and rng[1] is not None:
            said["Content-Range"] = rng[1]
    length = response.headers.get("content-length", "").strip()
    if length.isdigit():
        said["Content-Length"] = int(length) + (offset if response.status_code == 206 else 0)
    linked = _linked_size(response)
    if linked is not None:
        said["X-Linked-Size"] = linked
    if len(set(said.values())) > 1:
        stated = ", ".join(f"{k} {v:,}" for k, v in said.items())
        raise DownloadError(f"the server contradicts itself about the size of {what} ({stated}): the download "
                            "cannot be checked, so it was not kept; try again later or another address")
    return next(iter(said.values()), None)


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
        follow_redirects=True, max_redirects=MAX_REDIRECTS, timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    )
    expected = _Expected()
    try:
        failures = 0
        while True:
            cancel.check(target.name)
            offset = part.stat().st_size if part.exists() else 0
            try:
                attempt, digest = _fetch(client, url, part, offset, cancel, meter, progress, target.name,
                                         free_space, reserve_bytes, expected)
                if not _confirmed_whole(client, url, part, attempt, expected, expected_sha256, target.name):
                    raise _Dropped("the server has more bytes")  # resume from where the body ended
                break
            except httpx.TooManyRedirects:
                raise DownloadError(f"{url} redirects in a loop (more than {MAX_REDIRECTS} redirects): the address "
                                    "or the server is misconfigured") from None
            except httpx.UnsupportedProtocol as e:
                where = str(e.request.url) if _has_request(e) else "an address"
                raise DownloadError(f"{url} redirected the download to {where[:200]}, which is not an http(s) "
                                    "address: refused") from None
            except httpx.InvalidURL as e:
                raise DownloadError(f"{url} redirected the download to an invalid address ({e})") from None
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
        size, got, want = _verify(part, target.name, expected, expected_sha256, digest)
        part.replace(target)
        log.info("downloaded %s (%s, sha256 %s%s)", target, format_bytes(size), got[:12], " checked" if want else "")
        return target
    finally:
        if own_client:
            client.close()


def _verify(part: Path, name: str, expected: _Expected, expected_sha256: str | None,
            digest: "hashlib._Hash") -> tuple[int, str, str]:
    """(size, its SHA-256, the one published or "") of the finished `part`, checked whole: the size the server
    stated, the published checksum, a GGUF's own header; a part that fails is deleted, never named."""
    size = part.stat().st_size
    if expected.total is None or size != expected.total:  # _confirmed_whole said so; never named unchecked
        raise DownloadInterrupted(
            f"the download of {name} ended at {format_bytes(size)}"
            f"{' of ' + format_bytes(expected.total) if expected.total else ''}; pull again to resume"
        )
    want = (expected_sha256 or expected.sha256).lower()
    got = digest.hexdigest()
    if want and got != want:
        part.unlink(missing_ok=True)
        raise ChecksumMismatchError(
            f"{name} is damaged: its SHA-256 is {got[:16]}…, but {want[:16]}… was published for it. "
            "The file was deleted; try again (if it happens again, the server's copy is damaged)"
        )
    if is_gguf_name(name) and (short := gguf_shortfall(part)):
        # The server said this was all (a short Content-Length it stands by, or a file cut short on its side),
        # and a checksum of these bytes would match them: only the file's own header shows it is not whole.
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{name} is incomplete: the server sent {size:,} bytes as the whole file, but its GGUF header "
            f"says otherwise ({short}). It was deleted, not named; the server's copy or the size it states is "
            "wrong, so try another address or later"
        )
    return size, got, want


def _has_request(e: httpx.HTTPError) -> bool:
    try:
        e.request  # noqa: B018 - httpx raises RuntimeError when the error has no request
        return True
    except RuntimeError:
        return False


class _TooLong(Exception):
    """The body runs past the size the server stated."""


class _Dropped(Exception):
    """The body ended before Content-Length said it would (a dropped connection on some servers)."""


def _agree(expected: _Expected, attempt: _Attempt, part: Path, what: str) -> None:
    """Remember what the first answer said about the whole file; a later answer that differs is a changed file
    (or a lying server): the part is deleted, since bytes of two different files must never be joined."""
    changed = []
    if attempt.total is not None:
        if expected.total is not None and attempt.total != expected.total:
            changed.append(f"its size was {expected.total:,} bytes, now {attempt.total:,}")
        expected.total = expected.total if expected.total is not None else attempt.total
    if attempt.published_sha256:
        if expected.sha256 and attempt.published_sha256 != expected.sha256:
            changed.append("its published SHA-256 changed")
        expected.sha256 = expected.sha256 or attempt.published_sha256
    if changed:
        part.unlink(missing_ok=True)
        raise DownloadError(f"the server's answers about {what} disagree ({'; '.join(changed)}): the part received "
                            "was deleted; pull again to start over")


def _confirmed_whole(client: httpx.Client, url: str, part: Path, attempt: _Attempt, expected: _Expected,
                     given_sha256: str | None, what: str) -> bool:
    """True when `part` is the whole file as far as the server can tell; False when the server has more bytes
    (the caller resumes); DownloadError when it cannot be made to agree."""
    size = part.stat().st_size
    if expected.total is not None and size != expected.total:
        return False  # short: resume (a longer part was refused while writing)
    if expected.total is not None and attempt.framed and (given_sha256 or expected.sha256):
        return True  # the length was stated and the checksum will prove the bytes
    # The length was not stated (a body ended by a closed connection), or nothing will prove the bytes: ask the
    # server for what comes after them. 416 "*/size" confirms the size, 206 says there is more.
    with client.stream("GET", url, headers={"Range": f"bytes={size}-", "Accept-Encoding": "identity"}) as probe:
        if probe.status_code == 206:
            rng = _content_range(probe)
            if rng is not None and rng[1] is not None:
                _agree(expected, _Attempt(rng[1], ""), part, what)
            return False
        if probe.status_code == 416:
            rng = probe.headers.get("content-range", "").rpartition("/")[2].strip()
            if rng.isdigit():
                _agree(expected, _Attempt(int(rng), ""), part, what)
                if int(rng) == size:
                    return True
                part.unlink(missing_ok=True)
                raise DownloadError(f"{what} came out {size:,} bytes long where the server says {int(rng):,}: "
                                    "the part was deleted; pull again")
        elif probe.status_code == 200:
            length = probe.headers.get("content-length", "").strip()
            if length.isdigit():
                _agree(expected, _Attempt(int(length), ""), part, what)
                return int(length) == size
    if expected.total is not None and (attempt.framed or given_sha256 or expected.sha256):
        return True  # the server cannot say more than it did; the stated length matched (and a checksum follows)
    raise DownloadInterrupted(
        f"the download of {what} ended after {format_bytes(size)} without the server saying the file's size, and "
        "it cannot confirm it: the part is kept, but the file cannot be known to be whole (pull again to retry, or "
        "give its --sha256)"
    )


def _fetch(client: httpx.Client, url: str, part: Path, offset: int, cancel: CancelToken, meter: RateMeter,
           progress: ProgressFn | None, what: str, free_space: FreeSpaceFn, reserve: int,
           expected: _Expected) -> tuple[_Attempt, "hashlib._Hash"]:
    """One GET from `offset`: append to `part`; return what the response said and the SHA-256 so far."""
    headers = {"Range": f"bytes={offset}-", "Accept-Encoding": "identity"} if offset else {"Accept-Encoding": "identity"}
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code == 416 and offset:
            _, _, total = response.headers.get("content-range", "").rpartition("/")
            if total.strip() == str(offset):  # the part is already whole (an earlier run stopped before renaming)
                attempt = _Attempt(offset, _published(response), framed=True)
                _agree(expected, attempt, part, what)
                return attempt, _hash_existing(part, offset)
            part.unlink(missing_ok=True)  # the file changed on the server: start over
            raise _Dropped("range not satisfiable")
        if response.status_code >= 400:
            raise _http_error(url, response)
        if offset and response.status_code == 206:
            rng = _content_range(response)
            if rng is None or rng[0] != offset:  # bytes from elsewhere must never be appended to the part
                log.info("%s answered a resume from byte %s with bytes from %s; starting again", url, offset,
                         "an unstated place" if rng is None else rng[0])
                part.unlink(missing_ok=True)
                raise _Dropped("a resume answered from the wrong offset")
        if offset and response.status_code != 206:
            log.info("%s ignored the Range request; starting again from the first byte", url)
            offset = 0
        total = _total_from(response, offset, what)
        framed = "content-length" in response.headers or "chunked" in response.headers.get("transfer-encoding", "").lower()
        attempt = _Attempt(total, _published(response), framed)
        _agree(expected, attempt, part, what)
        total = expected.total
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
                    if total is not None and done + len(chunk) > total:  # never grow the part past the file
                        raise _TooLong(f"the server sent more than the {total:,} bytes it said {what} has")
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
        except _TooLong as e:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{e}: the part was deleted; pull again (if it happens again, the server is broken)") from None
        if total is not None and done < total:
            raise _Dropped(f"{done} of {total} bytes")
    return attempt, h
