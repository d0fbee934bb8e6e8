"""What proxy mode takes from the upstream per answer, and how long it waits for it.

Each limit is here so that a hostile or broken upstream (an endless stream, a 300 MB answer, a server that
never answers) or clients that give up cannot fill the proxy's memory or hold all its connections: an answer
past a cap ends with 502 `bad_upstream` (a stream: the usual error event and `[DONE]`), and a request that
finds every connection to the upstream taken gets 503 `upstream_busy` after a short wait. `ProxyLimits` holds
them (`ServeOptions.proxy`), so a test or a caller can set them lower.
"""

from __future__ import annotations

from dataclasses import dataclass

PROXY_MAX_ANSWER_BYTES = 48 * 2**20  # one answer's bytes (whole or streamed): the upstream is asked for 20
# alternatives per token, ~1.5 KB of JSON each, so this is ~32,000 tokens; a whole answer is held and parsed at
# once (~5x its size at the peak), a stream's bytes are passed on as they come
PROXY_MAX_ANSWER_TOKENS = 32_768  # one answer's recorded tokens, all its choices together: the record holds
# ~4 KB per token with its alternatives (measured: 46,000 tokens of an endless stream, +178 MB), so ~130 MB
PROXY_MAX_LINE_BYTES = 4 * 2**20  # one line of a stream (one chunk of ~2,000 tokens' log-probs): held whole
PROXY_MAX_ERROR_BYTES = 64 * 2**10  # an upstream's refusal: only its first line is passed on
PROXY_MAX_CHOICES = 1024  # answers recorded of one request (n per prompt of a completions list): each is a
# record of its own, made before the upstream answers
PROXY_MAX_JSON_DEPTH = 64  # an answer nests ~6 deep (choices, logprobs, content, top_logprobs)
PROXY_MAX_CONNECTIONS = 100  # open connections to the upstream at once (httpx's default pool)
PROXY_POOL_WAIT_S = 10.0  # a request that finds them all taken waits this long, then gets 503
PROXY_CONNECT_TIMEOUT_S = 10.0
PROXY_READ_TIMEOUT_S = 600.0  # between two reads: a whole answer's headers come when the upstream has finished it
PROXY_DISCONNECT_POLL_S = 0.2  # how often a request waiting on the upstream looks whether its client is still there


@dataclass(frozen=True)
class ProxyLimits:
    """The limits one proxy server applies (the module's constants by default)."""

    max_answer_bytes: int = PROXY_MAX_ANSWER_BYTES
    max_answer_tokens: int = PROXY_MAX_ANSWER_TOKENS
    max_line_bytes: int = PROXY_MAX_LINE_BYTES
    max_connections: int = PROXY_MAX_CONNECTIONS
    pool_wait_s: float = PROXY_POOL_WAIT_S
    connect_timeout_s: float = PROXY_CONNECT_TIMEOUT_S
    read_timeout_s: float = PROXY_READ_TIMEOUT_S
    disconnect_poll_s: float = PROXY_DISCONNECT_POLL_S
