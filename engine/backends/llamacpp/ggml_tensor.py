"""Reading ggml tensors inside llama.cpp's eval callback (`cb_eval`), as llama.cpp's eval-callback example does.

llama-cpp-python passes the callback a bare `struct ggml_tensor *`. The
leading fields of that struct (type, buffer, ne, nb, op, op_params, flags,
src, view_src, view_offs, data, name) are mirrored here; the rest is never
touched. Values are copied out with `ggml_backend_tensor_get`, which works
whatever device holds the tensor (CPU, Metal, CUDA, Vulkan), and the copy is
laid out with the tensor's own strides, so views (a permuted Q, the KV
cache's K) read correctly.
"""

from __future__ import annotations

import ctypes
import functools
import re

import numpy as np

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64  # bytes
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
# ggml_type values of the element types read here (ggml.h)
_DTYPES = {0: np.float32, 1: np.float16}
GGML_TYPE_BF16 = 30


class GgmlTensor(ctypes.Structure):
    """The leading fields of `struct ggml_tensor` (ggml.h), up to and including `name`."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),  # elements per dimension, ne[0] fastest
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),  # stride in bytes per dimension
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
    ]


@functools.cache
def _ggml() -> ctypes.CDLL:
    """ggml's C library as llama-cpp-python ships it, with the few signatures used here."""
    from llama_cpp._ggml import libggml

    lib = libggml
    lib.ggml_op_name.argtypes = [ctypes.c_int]
    lib.ggml_op_name.restype = ctypes.c_char_p
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    return lib


class Node:
    """One tensor the callback sees: its name, op and shape, and its values on request."""

    def __init__(self, address: int):
        self.address = address
        self.t = GgmlTensor.from_address(address)

    @property
    def name(self) -> str:
        return self.t.name.decode("utf-8", errors="replace")

    @functools.cached_property
    def op(self) -> str:
        return (_ggml().ggml_op_name(self.t.op) or b"").decode()

    @property
    def ne(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.t.ne)

    def src(self, i: int) -> "Node | None":
        address = self.t.src[i]
        return Node(address) if address else None

    def op_param_floats(self, n: int) -> np.ndarray:
        """The first `n` op parameters read as float32 (softmax and flash attention keep their scale there)."""
        return np.frombuffer(bytes(self.t.op_params), dtype=np.float32, count=n).copy()

    def values(self) -> np.ndarray:
        """A float32 copy shaped (ne3, ne2, ne1, ne0), read through the tensor's strides (views included)."""
        ggml = _ggml()
        size = int(ggml.ggml_nbytes(self.address))
        raw = np.empty(size, dtype=np.uint8)
        ggml.ggml_backend_tensor_get(self.address, raw.ctypes.data, 0, size)
        dtype = _DTYPES.get(self.t.type)
        if dtype is None and self.t.type != GGML_TYPE_BF16:
            raise TypeError(f"tensor {self.name!r} has ggml type {self.t.type}, which the layer view cannot read")
        item = np.dtype(dtype or np.uint16)
        shape = tuple(reversed(self.ne))
        strides = tuple(int(s) for s in reversed(self.t.nb))
        arr = np.ndarray(shape=shape, dtype=item, buffer=raw, strides=strides)
        if dtype is None:  # bfloat16: the high half of a float32
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(np.float32)


_LAYER = re.compile(r"(?:-|_l)(\d+)(?:\s|$)")


def layer_of(name: str) -> int | None:
    """The layer number llama.cpp put in a tensor's name ("l_out-12", "Qcur-3 (view)", "cache_k_l3 (view)")."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None
