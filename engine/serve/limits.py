"""What one request to the server may ask for (sizes, counts and depths, checked before anything runs), and what
one connection may hold (time for its headers and body, a place among a bounded number).

Each limit is here so that a hostile or mistaken client gets a 400/408/413/503 in words instead of a stalled
model, a crash in a recursive parser, a response that cannot be built, or a server out of file descriptors.
"""

from __future__ import annotations

from engine.sampling.settings import DRY_BREAKER_MAX_CHARS, DRY_MAX_BREAKERS

MAX_BODY_BYTES = 4 * 2**20  # a request body; a long prompt of a whole context is well under 1 MiB
MAX_JSON_DEPTH = 32  # OpenAI request bodies nest 5 deep (a JSON schema in response_format a little more)
MAX_N = 16  # choices per request (the loom's most children, engine.loom.continuations.MAX_CHILDREN)
MAX_TOP_LOGPROBS = 100  # alternatives per token in an answer (chat top_logprobs, completions logprobs, n_probs)
MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 1000  # characters per stop string
# DRY's sequence breakers: each one is looked up in the whole vocabulary before the first token. The sampler
# settings refuse more (so the CLI and the window cannot ask for them either); the server says so first.
MAX_DRY_BREAKERS = DRY_MAX_BREAKERS  # 64
MAX_DRY_BREAKER_CHARS = DRY_BREAKER_MAX_CHARS  # 40, llama.cpp's own limit on one breaker
MAX_MESSAGES = 10_000  # messages in one chat request
MAX_PROMPTS = 32  # prompts in one completions request (lm-eval sends its batch_size); each waits as a request would
MAX_BATCH_ROWS = 16  # answers (a request's n each) that share one batch of the model's forwards
MAX_WAITING = 64  # requests waiting for a model before the server answers 503 (busy)

# Connections (issue 43: 1,100 connections that never finished their headers took every file descriptor, and
# /health and chat timed out). Defaults of `ServeOptions`; `logitlab-cli serve` sets them with the flags named.
HEADER_TIMEOUT_S = 10.0  # a connection's request line and headers must all come within this (--header-timeout);
                         # else 408 and the connection closes (nginx allows 60 s, Apache's reqtimeout 20-40 s)
BODY_TIMEOUT_S = 30.0  # a request's body must all come within this of its headers (--timeout, llama.cpp server's
                       # name for its read timeout, 600 s there); else 408 and the connection closes. 4 MiB in 30 s
                       # is 140 KB/s: any real client's link is faster
KEEP_ALIVE_S = 5  # an idle connection between requests is closed after this (uvicorn's timeout_keep_alive)
MAX_CONNECTIONS = 512  # open connections at once (--max-connections); past it a new one gets a 503 and is closed.
                       # Never more than the process's open-file limit leaves room for (below)
LISTEN_QUEUE = 128  # connections the system holds for the server before it accepts them (the listening socket's
                   # backlog; past it a client's connect is retried by its system)
ACCEPT_BURST = 16  # the most connections asyncio accepts in one turn of the loop (create_server's backlog): one
                   # turned away past the cap holds a descriptor for about four turns (accepted, made, closed)
CONNECTION_FD_RESERVE = 64  # file descriptors kept for the model, its files, the log and the like (14 on SmolLM2
                            # with llama.cpp). The cap is the open-file limit less this and 4 * ACCEPT_BURST: at
                            # 1,024, 896 (so 512 holds); at 256 (macOS's default), 128
LOG_REPEAT_S = 10.0  # the same error is logged at most once per this many seconds, then with how many were held back
DISCONNECT_POLL_S = 0.2  # how often a whole (not streamed) answer looks whether its client is still there
