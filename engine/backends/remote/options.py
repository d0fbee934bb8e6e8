"""How to reach one server: base URL, model, API key, timeouts.

The API key comes from the app (which keeps it in the OS keyring) through
`remember_connection`, or from `$LOGITLAB_API_KEY`. It lives only in this
process's memory and in the Authorization header: never in a log line, an
error message, a `ModelInfo` or the database (`ConnectionOptions.__repr__`
hides it).

Credentials written into the URL (`http://user:secret@host:port/v1`) are
treated like the key: `parse_spec` gives the URL without them, so the base
URL, `host`, the spec a `ModelInfo` shows and anything stored hold none, and
they travel only as HTTP Basic auth (`ConnectionOptions.credentials`, hidden
from `repr`), from the spec itself or from `remember_connection`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

API_KEY_ENV = "LOGITLAB_API_KEY"
TIMEOUT_ENV = "LOGITLAB_REMOTE_TIMEOUT"  # seconds to wait for a response (or between streamed tokens)
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ConnectionOptions:
    base_url: str  # ends in /v1 (added when missing)
    model: str = ""  # "" = the server's first (often only) model
    api_key: str | None = field(default=None, repr=False)
    credentials: str | None = field(default=None, repr=False)  # "user:password" from the URL, for Basic auth
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    retries: int = 3  # extra tries for idempotent requests on 429/5xx

    def __post_init__(self) -> None:
        for name in ("timeout_s", "connect_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= 10:
            raise ValueError(f"retries must be an integer in [0, 10], got {self.retries!r}")

    @property
    def host(self) -> str:
        """host:port, for the status bar and messages."""
        return urlsplit(self.base_url).netloc

    @property
    def basic_auth(self) -> tuple[str, str] | None:
        """(user, password) for HTTP Basic auth, percent-decoded, when the URL carried credentials."""
        if not self.credentials:
            return None
        user, _, password = self.credentials.partition(":")
        return unquote(user), unquote(password)

    @property
    def server_root(self) -> str:
        """The URL without the /v1 suffix: extras such as /tokenize live there."""
        root = self.base_url.rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root


def _cut_credentials(text: str) -> None:
    """ValueError when the URL's credentials hold an unencoded '/', '#' or '?': those end the host part, so the
    rest of the password would be read as the path or the model name (and end up in a message). Said with the
    credentials hidden."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return
    end = min((i for i in (rest.find(c) for c in "/#?") if i >= 0), default=len(rest))
    if "@" in rest[:end] or "@" not in rest[end:]:
        return  # credentials (if any) are whole, or the '@' belongs to a model name after the host
    authority = rest[:end]
    user, colon, after = authority.partition(":")
    if not colon or (after.isdigit() and "@" not in rest[end:].partition("#")[0]):
        return  # host:port, then an '@' in the model name ("http://host:8000/v1#org/model@v2")
    host = rest[rest.rfind("@") + 1 :]
    raise ValueError(
        f"the server URL's password (or user name) holds a '/', '#' or '?', which end the host part of an address: "
        f"write them percent-encoded (/ as %2F, # as %23, ? as %3F), as in {scheme}://user:<password, encoded>@{host}"
        " (the credentials are not shown here)"
    )


def split_credentials(spec: str) -> tuple[str, str | None]:
    """(`spec` without credentials, "user:password" as written in its URL or None). Never echoes them.

    ValueError (without the credentials) when they hold an unencoded '/', '#' or '?'."""
    text = spec.strip()
    _cut_credentials(text)
    url, sep, model = text.partition("#")
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return text, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=hostport)) + sep + model, userinfo or None


def parse_spec(spec: str) -> tuple[str, str]:
    """`http://host:port/v1#model` -> (base URL ending in /v1, model or ""); credentials in the URL are left out."""
    clean, credentials = split_credentials(spec)
    shown = clean if credentials is None else f"{clean} (credentials hidden)"  # a message never holds them
    base, _, model = clean.partition("#")
    base = base.rstrip("/")
    parts = urlsplit(base)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not a server URL: {shown!r} (expected http://host:port/v1)")
    if parts.query or parts.fragment:
        raise ValueError(f"a server URL takes no query string: {shown!r}")
    if not parts.path.endswith("/v1"):
        base = base + "/v1"
    return base, model.strip()


def clean_spec(spec: str) -> str:
    """`spec` as it may be shown and stored: base URL and model, without credentials."""
    base, model = parse_spec(spec)
    return f"{base}#{model}" if model else base


_remembered: dict[str, ConnectionOptions] = {}
_lock = threading.Lock()


def remember_connection(
    base_url: str,
    *,
    api_key: str | None = None,
    timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
    credentials: str | None = None,
) -> None:
    """Key, URL credentials ("user:password", else those in `base_url`) and timeouts to use for `base_url` in
    this process (the app calls this before loading, with what its key store holds)."""
    base, _ = parse_spec(base_url)
    credentials = credentials or split_credentials(base_url)[1]
    opts = ConnectionOptions(base, api_key=api_key or None, credentials=credentials or None)
    if timeout_s is not None:
        opts = replace(opts, timeout_s=float(timeout_s))
    if connect_timeout_s is not None:
        opts = replace(opts, connect_timeout_s=float(connect_timeout_s))
    with _lock:
        _remembered[base] = opts


def options_for(spec: str, **overrides: Any) -> ConnectionOptions:  # fields of ConnectionOptions, checked by it
    """Options for a spec: what was remembered for its base URL, else the environment; then `overrides`.
    Credentials written in `spec` win over remembered ones."""
    base, model = parse_spec(spec)
    in_url = split_credentials(spec)[1]
    with _lock:
        known = _remembered.get(base)
    if known is not None:
        opts = replace(known, model=model)
    else:
        timeout = os.environ.get(TIMEOUT_ENV)
        try:
            t = float(timeout) if timeout else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ValueError(f"${TIMEOUT_ENV} must be a number of seconds, got {timeout!r}") from None
        opts = ConnectionOptions(base, model, timeout_s=t)
    if opts.api_key is None and os.environ.get(API_KEY_ENV):
        opts = replace(opts, api_key=os.environ[API_KEY_ENV])
    if in_url:
        opts = replace(opts, credentials=in_url)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return replace(opts, **overrides) if overrides else opts
