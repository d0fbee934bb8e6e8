"""The `remote` backend: a model on an OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama, LM Studio).

- `RemoteBackend` (backend.py): the 5-method Backend protocol, "we sample" from the server's top-N.
- `server_stream.py`: "server samples", a streamed completion with our settings mapped to its parameters.
- `many_choices.py`: the loom's N server-sampled children in one request (the API's `n`), one by one where not.
- `generate.remote_events`: which of the two a request gets (the worker dispatches here).
- `probe.py`: what the server can do; `client.py`: HTTP with one-line errors and bounded retries;
  `options.py`: URL, model, API key and timeouts; `tokenizer.py`: the server's tokenizer.
"""

from engine.backends.remote.backend import RemoteBackend
from engine.backends.remote.errors import (
    ServerAuthError,
    ServerError,
    ServerResponseError,
    ServerTimeoutError,
    ServerUnreachableError,
    StreamCutError,
    UnknownServerModelError,
    UnsupportedByServerError,
)
from engine.backends.remote.options import API_KEY_ENV, ConnectionOptions, remember_connection

__all__ = [
    "API_KEY_ENV",
    "ConnectionOptions",
    "RemoteBackend",
    "ServerAuthError",
    "ServerError",
    "ServerResponseError",
    "ServerTimeoutError",
    "ServerUnreachableError",
    "StreamCutError",
    "UnknownServerModelError",
    "UnsupportedByServerError",
    "remember_connection",
]
