"""What one request to the server may ask for: sizes, counts and depths, checked before anything runs.

Each limit is here so that a hostile or mistaken client gets a 400/413 in words instead of a stalled model,
a crash in a recursive parser or a response that cannot be built.
"""

from __future__ import annotations

MAX_BODY_BYTES = 4 * 2**20  # a request body; a long prompt of a whole context is well under 1 MiB
MAX_JSON_DEPTH = 32  # OpenAI request bodies nest 5 deep (a JSON schema in response_format a little more)
MAX_N = 16  # choices per request (the loom's most children, engine.loom.continuations.MAX_CHILDREN)
MAX_TOP_LOGPROBS = 100  # alternatives per token in an answer (chat top_logprobs, completions logprobs, n_probs)
MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 1000  # characters per stop string
MAX_MESSAGES = 10_000  # messages in one chat request
MAX_BATCH_ROWS = 16  # answers (a request's n each) that share one batch of the model's forwards
MAX_WAITING = 64  # requests waiting for a model before the server answers 503 (busy)
