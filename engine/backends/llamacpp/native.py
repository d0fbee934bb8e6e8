"""The few llama.cpp C calls the backend, its tokenizer and the research runner share.

We use llama-cpp-python's ctypes bindings (`llama_cpp.llama_cpp`) directly
rather than its `Llama` class: `Llama` keeps every position's logits
(`logits_all`), samples with llama.cpp's own chain, and owns the KV cache,
while the engine needs one (V,) row of logits per step, its own sampler and
its own prefix reuse.

llama.cpp's log goes to Python logging (logger "engine.llamacpp.native"),
not to stderr; the last error lines are kept so that a failed load can say
why ("unknown model architecture: 'foo'").
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

log = logging.getLogger(__name__)

# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 ("continues the previous line").
_LEVELS = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_init_lock = threading.Lock()
_initialised = False
# Per thread: while its predicate holds, llama.cpp's failure lines on this thread are an abort we asked for.
_expected_abort = threading.local()


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace").rstrip()
    if not message:
        return
    py_level = _LEVELS.get(level, logging.DEBUG)  # llama.cpp's INFO is chatty (every metadata key): DEBUG here
    expected = getattr(_expected_abort, "predicate", None)
    if expected is not None and expected():
        py_level = logging.DEBUG  # a cancel, not a failure: nothing for the user or the next error message
    elif py_level >= logging.WARNING:
        _recent_errors.append(message)
    log.log(py_level, "%s", message)


def expect_aborts(predicate: Callable[[], bool] | None) -> None:
    """On the calling thread, while `predicate()` is true, llama.cpp's log lines are a requested abort
    unwinding (debug level, not kept as errors); None ends that."""
    _expected_abort.predicate = predicate


def init() -> None:
    """Initialise llama.cpp once per process and route its log to Python logging."""
    global _initialised
    with _init_lock:
        if not _initialised:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialised = True


# llama-cpp-python's own default, kept before `use_safe_defaults_for_llama_class` replaces it with model_params.
_original_default_params = llama_cpp.llama_cpp.llama_model_default_params


@functools.cache
def amx_built() -> bool:
    """Whether this llama.cpp build carries ggml's AMX matmul (compiled in when built on a CPU with AMX)."""
    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def model_params(n_gpu_layers: int | None = None) -> llama_cpp.llama_model_params:
    """llama.cpp's default model parameters, without the AMX weight layout where the build has one.

    On CPUs with AMX (Xeon Sapphire Rapids and later) a source build of
    llama-cpp-python 0.3.36 puts Q4_0/Q4_1/Q8_0/K-quant weights in AMX
    "extra" buffers, and its AMX matmul then crashes on the first prompt of
    more than one token (seen here: SIGSEGV in ggml_backend_amx_mul_mat on
    the default Q4_1 model; upstream ggml-org/llama.cpp#20824, and #16315 on
    wrong Q4_0/Q4_1 results). Without extra buffers the weights stay in the
    plain CPU layout that the AVX-512 kernels read. Extra buffers also hold
    llama.cpp's repacked Q4_0 layout, so they are given up only on such builds.
    """
    params = _original_default_params()
    if n_gpu_layers is not None:
        params.n_gpu_layers = n_gpu_layers
    if amx_built():
        params.use_extra_bufts = False
    return params


def use_safe_defaults_for_llama_class() -> None:
    """Make llama-cpp-python's own `Llama` class (its server, reference runs in tests and benches) load models
    with `model_params()`, so that they do not crash on AMX builds either."""
    llama_cpp.llama_cpp.llama_model_default_params = model_params


def take_recent_errors() -> str:
    """The warnings/errors llama.cpp logged since the last call, one line."""
    text = "; ".join(_recent_errors)
    _recent_errors.clear()
    return text


# --- devices ------------------------------------------------------------------


@dataclass(frozen=True)
class GpuDevice:
    name: str  # "CUDA0", "Metal", "Vulkan0"
    description: str  # "NVIDIA GeForce RTX 4090"
    free_bytes: int
    total_bytes: int


_GGML_DEV_GPU, _GGML_DEV_IGPU = 1, 2


def gpu_devices() -> list[GpuDevice]:
    """The GPUs this llama.cpp build can use (none on a CPU build), through ggml's device registry."""
    if not llama_cpp.llama_supports_gpu_offload():
        return []
    try:
        from llama_cpp._ggml import libggml

        lib = libggml
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_char_p
        size_p = ctypes.POINTER(ctypes.c_size_t)
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
        devices = []
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            if lib.ggml_backend_dev_type(dev) not in (_GGML_DEV_GPU, _GGML_DEV_IGPU):
                continue
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            devices.append(
                GpuDevice(
                    name=(lib.ggml_backend_dev_name(dev) or b"GPU").decode(errors="replace"),
                    description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                    free_bytes=int(free.value),
                    total_bytes=int(total.value),
                )
            )
        return devices
    except (AttributeError, OSError) as e:  # an older or unusual build without the device registry
        log.debug("cannot list ggml devices: %s", e)
        return []


# --- model metadata -------------------------------------------------------------


def meta_str(model: Any, key: str) -> str | None:
    """A metadata value as llama.cpp formats it, or None when the key is absent."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8", errors="replace")
        size = n + 1


# --- batches and logits ---------------------------------------------------------


class Batch:
    """A reusable `llama_batch` of up to `capacity` tokens, filled row by row."""

    def __init__(self, capacity: int, n_seq_max: int = 1):
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, n_seq_max)
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token; returns its index in the batch (the index `llama_get_logits_ith` takes)."""
        i = self.n
        if i >= self.capacity:
            raise ValueError(f"batch full ({self.capacity} tokens)")
        b = self.raw
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq_id
        b.logits[i] = logits
        self.n = i + 1
        b.n_tokens = self.n
        return i

    def free(self) -> None:
        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


def logits_row(ctx: Any, index: int, n_vocab: int) -> np.ndarray:
    """A float32 (V,) copy of the logits llama.cpp computed for batch position `index` (-1: the last output)."""
    ptr = llama_cpp.llama_get_logits_ith(ctx, index)
    if not ptr:
        raise RuntimeError(f"llama.cpp has no logits for batch position {index}")
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()


class DecodeError(RuntimeError):
    """`llama_decode` failed; `code` 1 means the KV cache has no room left."""

    def __init__(self, code: int):
        self.code = code
        reason = {
            1: "no room left in the KV cache (the context is full)",
            2: "aborted",
            -1: "invalid batch",
        }.get(code, "see the llama.cpp log")
        detail = take_recent_errors()
        super().__init__(f"llama_decode failed ({code}): {reason}" + (f" [{detail}]" if detail else ""))


def decode(ctx: Any, batch: Batch) -> None:
    code = llama_cpp.llama_decode(ctx, batch.raw)
    if code != 0:
        raise DecodeError(code)


def free_context(ctx: Any, batch: Batch | None) -> None:
    """Free a context and the batch used with it; either may already be gone (None / NULL)."""
    if batch is not None:
        batch.free()
    if ctx:
        llama_cpp.llama_free(ctx)
