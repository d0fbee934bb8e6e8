"""Stopping a running `llama_decode` from another thread, within milliseconds.

A prompt runs in chunks of `n_batch` tokens, and one chunk can take seconds
(0.24-3.68 s measured for 512 tokens). llama.cpp's CPU backend asks an
abort callback after every graph node (a few thousand per chunk) and stops
when it answers true; `llama_decode` then returns 2 and removes that chunk's
positions from the cache, so the cache holds exactly the chunks that ran.

The callback must not be Python: a ctypes callback takes the GIL on every
node, and with another Python thread busy (the window's) each take waits up
to the 5 ms switch interval; a 512-token chunk went from 2.8 s to 4.8 s here.
So the callback is libc's `strlen` over a two-byte buffer `[flag, NUL]`: it
returns 1 when the flag byte is set and 0 when not, exactly what a
`bool (*)(void *)` callback must answer, read without Python. A helper thread
polls the caller's `cancelled()` every `POLL_S` and sets the byte. Where no
C `strlen` can be found, the callback is a Python one reading the same byte.

GPU backends (CUDA, Vulkan) run a chunk's graph without asking the callback;
there a cancel waits for the chunk, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import llama_cpp

from engine.backends.llamacpp import native

log = logging.getLogger(__name__)

POLL_S = 0.01  # how often the watcher asks `cancelled()`: the cancel latency, plus one graph node
ABORTED = 2  # llama_decode's return code when the abort callback said stop


def _c_strlen() -> Any | None:
    """libc's `strlen` as a ctypes function, or None where it cannot be found."""
    for name in ("ucrtbase", "msvcrt") if sys.platform == "win32" else (None,):
        try:
            return ctypes.CDLL(name).strlen
        except (OSError, AttributeError, TypeError):
            continue
    return None


class AbortSwitch:
    """The abort callback of one llama.cpp context, and a flag to trip it from any thread."""

    def __init__(self, ctx: Any):
        self._flag = ctypes.create_string_buffer(2)  # [flag, NUL]: strlen is 1 when tripped, 0 when not
        strlen = _c_strlen()
        if strlen is not None:
            self._callback = ctypes.cast(strlen, llama_cpp.llama_cpp.ggml_abort_callback)
        else:  # correct, but it takes the GIL once per graph node
            log.debug("no C strlen found: llama.cpp's abort callback runs in Python")
            flag = self._flag
            self._callback = llama_cpp.llama_cpp.ggml_abort_callback(lambda _data: flag.raw[0] != 0)
        # The context keeps only raw pointers: this object holds the buffer and the callback alive.
        llama_cpp.llama_set_abort_callback(ctx, self._callback, ctypes.cast(self._flag, ctypes.c_void_p))

    @property
    def tripped(self) -> bool:
        return self._flag.raw[0] != 0

    def trip(self) -> None:
        self._flag[0] = b"\x01"

    def reset(self) -> None:
        self._flag[0] = b"\x00"

    @contextlib.contextmanager
    def watching(self, cancelled: Callable[[], bool], poll_s: float = POLL_S) -> Iterator[None]:
        """Trip the switch as soon as `cancelled()` is true, for the duration of the block.

        `cancelled` is called from a helper thread, so it must be thread-safe
        (`threading.Event.is_set` is). On leaving, the switch is reset, and the
        failure lines llama.cpp logs for an abort asked for here are debug lines.
        """
        done = threading.Event()

        def watch() -> None:
            while not done.wait(poll_s):
                if cancelled():
                    self.trip()
                    return

        watcher = threading.Thread(target=watch, name="llama.cpp cancel watcher", daemon=True)
        native.expect_aborts(lambda: self.tripped)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()
            native.expect_aborts(None)
            self.reset()
