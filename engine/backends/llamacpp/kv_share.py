"""Start a second llama.cpp context from the backend's own KV cache instead of recomputing a shared prefix.

The layer view and the loom's batch runner run in contexts of their own (the
weights are shared, the caches are not). When what they compute begins with
tokens the backend's context already holds (the chat's prompt, the answer so
far), the backend's sequence state is copied over (`llama_state_seq_get_data`
/ `llama_state_seq_set_data`: a memcpy of the keys and values, ~23 KB a token
on the default model) and cut back to the shared part, so only the rest runs.
On the default model at one thread a prompt costs ~8 ms a token; a 1,000-token
chat would cost the loom ~8 s on every run without this.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

import llama_cpp

from engine.backend import common_prefix_len
from engine.backends.llamacpp import native

log = logging.getLogger(__name__)

MIN_REUSE = 16  # shared tokens: below this, copying the backend's KV state costs more than running them


def reuse_backend_state(
    backend: Any, ctx: Any, prefix: Sequence[int], seq: int = 0, *, limit: int | None = None, steering_key: Any = None
) -> int:
    """Copy the backend's cached KV state into sequence `seq` of `ctx`, cut to what `prefix` shares (at most
    `limit` tokens); returns the tokens kept (0: nothing was copied, `seq` is empty).

    Runs on the backend's worker thread: the backend's context is only read. A state that does not load here
    (another cache type, a context too small) is a debug line and 0, never an error.
    """
    # Keys and values computed under a control vector are not an unsteered context's (nor another vector's):
    # copied only into a context steered the same way (`steering_key`, None for none: engine/steering).
    key_now = getattr(backend, "steering_key", None)
    if (key_now() if key_now is not None else None) != steering_key:
        return 0
    shared = common_prefix_len(backend.cached_tokens(), prefix)
    if limit is not None:
        shared = min(shared, limit)
    if shared < MIN_REUSE:
        return 0
    size = llama_cpp.llama_state_seq_get_size(backend.ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    n = llama_cpp.llama_state_seq_get_data(backend.ctx, buf, size, 0)
    memory = llama_cpp.llama_get_memory(ctx)
    if n == 0 or llama_cpp.llama_state_seq_set_data(ctx, buf, n, seq) == 0:
        log.debug("the backend's KV state does not load into this context (%s); running the prefix",
                  native.take_recent_errors())
        llama_cpp.llama_memory_seq_rm(memory, seq, -1, -1)
        return 0
    llama_cpp.llama_memory_seq_rm(memory, seq, shared, -1)
    return shared
