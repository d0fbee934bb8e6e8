"""The model's final norm and unembedding, read from the GGUF and de-quantized, to put any layer's output through.

llama.cpp applies `output_norm` and `output` (or the tied `token_embd`) only
to the last layer inside its graph, so the logit lens of the other layers is
computed here in numpy on de-quantized weights (`gguf.quants.dequantize`).
The matrix is float32: (V, n_embd), 113 MB for the default model, 671 MB for
Gemma 3's 262k vocabulary; it is read once per loaded model (`for_backend`)
and dropped with it. Only the header and these tensors are read (a memory
map), not the whole file.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_cache: "weakref.WeakKeyDictionary[Any, Unembedding]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@dataclass(frozen=True)
class Unembedding:
    """Final norm (RMS, or LayerNorm when the file has a norm bias), unembedding and logit soft-capping."""

    norm_weight: np.ndarray  # (n_embd,)
    norm_bias: np.ndarray | None  # (n_embd,) for LayerNorm models
    eps: float
    matrix: np.ndarray  # (V, n_embd) float32; `@ matrix.T` hands BLAS the transpose flag, no (n_embd, V) copy
    softcap: float  # 0: none; else logits = softcap * tanh(logits / softcap) (Gemma 2)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(R, V) float32 logits of (R, n_embd) residual-stream rows, as the model's head would make them."""
        h: np.ndarray = hidden.astype(np.float32, copy=False)
        if self.norm_bias is None:
            h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + self.eps)
            h = h * self.norm_weight
        else:
            mu = h.mean(axis=-1, keepdims=True)
            h = (h - mu) / np.sqrt(((h - mu) ** 2).mean(axis=-1, keepdims=True) + self.eps)
            h = h * self.norm_weight + self.norm_bias
        out = h @ self.matrix.T
        if self.softcap:
            out = self.softcap * np.tanh(out / self.softcap)
        return out


def _tensor_records(path: Path) -> dict[str, tuple[list[int], int, int]]:
    """name -> (dims, ggml type, absolute file offset) of every tensor, from the GGUF header alone.

    `gguf.GGUFReader` builds numpy views of every metadata field, the vocabulary's 262k strings
    included (~10 s for Gemma 3); this skips them as the backend's header check does.
    """
    import mmap

    from engine.backends.llamacpp.gguf_header import DEFAULT_ALIGNMENT, _Cursor

    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        cur.pos = 8  # magic, version
        n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
        alignment = DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key = cur.string()
            value = cur.value(cur.take("<I"))
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        records = {}
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
            records[name] = (dims, cur.take("<I"), cur.take("<Q"))
        data_offset = -(-cur.pos // alignment) * alignment
    return {name: (dims, qtype, data_offset + offset) for name, (dims, qtype, offset) in records.items()}


def _dequantized(path: Path, record: tuple[list[int], int, int]) -> np.ndarray:
    """One tensor as float32, (rows, dims[0]) or (dims[0],), read through a memory map and de-quantized by `gguf`."""
    import gguf

    dims, qtype, offset = record
    kind = gguf.GGMLQuantizationType(qtype)
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
    row_bytes = dims[0] // block * type_size
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(rows, row_bytes))
    values = np.asarray(gguf.quants.dequantize(raw, kind), dtype=np.float32)
    return values.reshape(rows, dims[0]) if len(dims) > 1 else values.reshape(-1)


def read_unembedding(path: Path, header: Any) -> Unembedding:
    """The final norm and unembedding of the GGUF at `path` (`header`: its engine GGUFHeader)."""
    path = Path(path)
    tensors = _tensor_records(path)
    if "output_norm.weight" not in tensors:
        raise ValueError(f"{path.name} has no output_norm.weight: the layer view needs the model's final norm")
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"  # tied embeddings
    matrix = _dequantized(path, tensors[head])  # (V, n_embd)
    bias = _dequantized(path, tensors["output_norm.bias"]) if "output_norm.bias" in tensors else None
    eps_key = "attention.layer_norm_epsilon" if bias is not None else "attention.layer_norm_rms_epsilon"
    eps = float(header.arch_value(eps_key, 1e-5) or 1e-5)
    softcap = float(header.arch_value("final_logit_softcapping", 0.0) or 0.0)
    log.debug("layer view head of %s: %s %s, eps %g, softcap %g", path.name, head, matrix.shape, eps, softcap)
    return Unembedding(
        norm_weight=_dequantized(path, tensors["output_norm.weight"]),
        norm_bias=bias,
        eps=eps,
        matrix=matrix,
        softcap=softcap,
    )


def for_backend(backend: Any) -> Unembedding:
    """The backend's unembedding, read on first use and kept as long as the backend lives."""
    with _lock:
        found = _cache.get(backend)
        if found is None:
            found = _cache[backend] = read_unembedding(Path(backend.path), backend.header)
        return found
