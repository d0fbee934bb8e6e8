"""The model's final norm and unembedding, read from the GGUF and de-quantized, to put any layer's output through.

llama.cpp applies `output_norm` and `output` (or the tied `token_embd`) only
to the last layer inside its graph, so the logit lens of the other layers is
computed here in numpy on de-quantized weights (`gguf.quants.dequantize`).
The matrix is float32: (V, n_embd), 113 MB for the default model, 671 MB for
Gemma 3's 262k vocabulary; it is read once per loaded model (`for_backend`)
and dropped with it.
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
    matrix_t: np.ndarray  # (n_embd, V) float32, C-contiguous for the (R, n_embd) @ (n_embd, V) product
    softcap: float  # 0: none; else logits = softcap * tanh(logits / softcap) (Gemma 2)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(R, V) float32 logits of (R, n_embd) residual-stream rows, as the model's head would make them."""
        h = hidden.astype(np.float32, copy=False)
        if self.norm_bias is None:
            h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + self.eps)
            h = h * self.norm_weight
        else:
            mu = h.mean(axis=-1, keepdims=True)
            h = (h - mu) / np.sqrt(((h - mu) ** 2).mean(axis=-1, keepdims=True) + self.eps)
            h = h * self.norm_weight + self.norm_bias
        out = h @ self.matrix_t
        if self.softcap:
            out = self.softcap * np.tanh(out / self.softcap)
        return out


def read_unembedding(path: Path, header: Any) -> Unembedding:
    """The final norm and unembedding of the GGUF at `path` (`header`: its engine GGUFHeader)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}

    def dequantized(name: str) -> np.ndarray:
        t = tensors[name]
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.asarray(data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])

    if "output_norm.weight" not in tensors:
        raise ValueError(f"{path.name} has no output_norm.weight: the layer view needs the model's final norm")
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"  # tied embeddings
    matrix = dequantized(head)  # (V, n_embd)
    bias = dequantized("output_norm.bias").reshape(-1) if "output_norm.bias" in tensors else None
    eps_key = "attention.layer_norm_epsilon" if bias is not None else "attention.layer_norm_rms_epsilon"
    eps = float(header.arch_value(eps_key, 1e-5) or 1e-5)
    softcap = float(header.arch_value("final_logit_softcapping", 0.0) or 0.0)
    log.debug("layer view head of %s: %s %s, eps %g, softcap %g", path.name, head, matrix.shape, eps, softcap)
    return Unembedding(
        norm_weight=dequantized("output_norm.weight").reshape(-1),
        norm_bias=bias,
        eps=eps,
        matrix_t=np.ascontiguousarray(matrix.T),
        softcap=softcap,
    )


def for_backend(backend: Any) -> Unembedding:
    """The backend's unembedding, read on first use and kept as long as the backend lives."""
    with _lock:
        found = _cache.get(backend)
        if found is None:
            found = _cache[backend] = read_unembedding(Path(backend.path), backend.header)
        return found
