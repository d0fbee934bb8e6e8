"""Servers for callers outside the model's worker (the app, scripts), without the HTTP client at import.

`import engine` stays light: the remote package (and httpx with it) is imported
only when one of these is first called.

- `split_server_spec(spec)`: `http://host:port/v1#model` -> (base URL ending in /v1, model or "").
- `remember_connection(url, api_key=..., timeout_s=...)`: the key and timeouts that loading `url` will
  use in this process (the key lives in memory only: never in a log line, a message or `ModelInfo`).
- `list_server_models(url, ...)`: the model ids a server lists. It blocks on the network: call it from a
  worker thread or an executor, never from a UI thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.model_info import ServerInfo

if TYPE_CHECKING:
    import httpx

    from engine.backend import Backend


def split_server_spec(spec: str) -> tuple[str, str]:
    """(base URL ending in /v1, model or ""); ValueError naming the problem when `spec` is not a server URL."""
    from engine.backends.remote.options import parse_spec

    return parse_spec(spec)


def split_server_credentials(spec: str) -> tuple[str, str | None]:
    """(`spec` without the credentials its URL holds, those credentials "user:password" or None).

    Credentials belong where the API key lives (the app's key store), never in what is shown or saved.
    """
    from engine.backends.remote.options import split_credentials

    return split_credentials(spec)


def remember_connection(
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
    credentials: str | None = None,
) -> None:
    """Use this key, these URL credentials ("user:password") and these timeouts for `url` (its base URL) from
    now on in this process."""
    from engine.backends.remote.options import remember_connection as remember

    remember(url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, credentials=credentials)


def list_server_models(
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
    transport: httpx.BaseTransport | None = None,
) -> list[str]:
    """The ids of the models `url` serves (GET /v1/models), in the server's order.

    Key and timeouts default to what `remember_connection` or the environment gave for this URL.
    Raises an `EngineError` (a `ServerError`) with one line naming the host on any failure.
    """
    from engine.backends.remote.client import ServerClient
    from engine.backends.remote.options import options_for
    from engine.backends.remote.probe import list_models

    options = options_for(url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, retries=1)
    client = ServerClient(options, transport=transport)
    try:
        return [str(m["id"]) for m in list_models(client)]
    finally:
        client.close()


def round_trip_s(backend: Backend) -> float | None:
    """Seconds the last complete request to a remote model's server took (network and the server's work).

    None for a local model, or before the first request.
    """
    from engine.capabilities import RoundTrip

    return backend.round_trip_s() if isinstance(backend, RoundTrip) else None


def server_sampler_fields(server: ServerInfo) -> frozenset[str]:
    """The `SamplerSettings` fields a server takes when it samples (`ModelInfo.server`).

    Every other field must stay at its neutral value in server-samples mode (the request is refused,
    naming it, otherwise); "seed" is included only when the server's seeds proved reproducible.
    """
    from engine.backends.remote.server_params import PARAMETER_NAMES

    fields = set(PARAMETER_NAMES.get(server.kind, PARAMETER_NAMES["openai"]))
    if server.seed:
        fields.add("seed")
    return frozenset(fields)
