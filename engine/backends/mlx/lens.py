"""The layer view (logit lens) and attention on MLX: the model's layers run one by one, each output kept.

mlx-lm models have no `output_hidden_states`, so for the capture pass each
decoder layer in `model.layers` is wrapped by a recorder that calls it and
keeps its output (the model still builds its own masks and runs its own
layers in order, so any mlx-lm architecture works); the wrappers are
removed before returning. Layer i's output goes through the model's final
norm and head (the logit lens); the last entry is the model's own logits.

Attention weights are not returned by mlx-lm's fused attention, so they are
recomputed from each layer's attention input with that layer's own q/k
projections, q/k norms and RoPE: softmax(scale * q k^T) under the causal
mask. That covers the Llama family (Llama, SmolLM, Qwen, Mistral); a layer
without those parts says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from engine.lens import LayerCapture, check_positions, summarize, target_of


class _Recorded:
    """Calls a module and keeps what it returned (a layer) or was given (an attention block)."""

    def __init__(self, inner: Any, keep: list, keep_input: bool = False):
        self.inner, self.keep, self.keep_input = inner, keep, keep_input

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(x, *args, **kwargs)
        self.keep.append(x if self.keep_input else out)
        return out

    def __getattr__(self, name: str) -> Any:  # the model reads e.g. `layer.use_sliding`
        return getattr(self.inner, name)


def _head(model: Any, hidden: mx.array) -> mx.array:
    """Final norm and unembedding of (..., d) rows, as the model's own `__call__` applies them."""
    inner = model.model
    h = inner.norm(hidden)
    if getattr(model, "lm_head", None) is not None:
        out = model.lm_head(h)
    else:
        out = inner.embed_tokens.as_linear(h)
    cap = getattr(getattr(model, "args", None), "final_logit_softcapping", None)
    return cap * mx.tanh(out / cap) if cap else out


def _attention_weights(attn: Any, x: mx.array, rows: Sequence[int]) -> np.ndarray:
    """(H, len(rows), T) softmax(scale * q k^T) under the causal mask, from the attention block's input x (1, T, d)."""
    for part in ("q_proj", "k_proj", "rope", "n_heads", "n_kv_heads", "scale"):
        if not hasattr(attn, part):
            raise NotImplementedError(f"this model's attention has no {part}, so the layer view cannot show its weights")
    _, t, _ = x.shape
    q = attn.q_proj(x).reshape(1, t, attn.n_heads, -1).transpose(0, 2, 1, 3)  # (1, H, T, hd)
    k = attn.k_proj(x).reshape(1, t, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)  # (1, Hkv, T, hd)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = attn.rope(q), attn.rope(k)
    k = mx.repeat(k, attn.n_heads // attn.n_kv_heads, axis=1)  # grouped-query attention
    scores = (q @ k.transpose(0, 1, 3, 2))[0].astype(mx.float32) * attn.scale  # (H, T, T)
    causal = mx.triu(mx.full((t, t), -mx.inf), k=1)
    weights = mx.softmax(scores + causal, axis=-1)
    return np.array(weights[:, mx.array(list(rows))])


def layer_logits(model: Any, ids: Sequence[int], reads: Sequence[int], attention: bool
                 ) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """((P, L, V) float32 logit-lens logits at rows `reads`, per read row (L, H, row + 1) attention or None)."""
    layers = model.layers  # mlx-lm: the decoder's own list, so replacing an entry reroutes the forward
    outputs: list[mx.array] = []
    inputs: list[list[mx.array]] = [[] for _ in layers]
    originals = list(layers)
    try:
        for i, layer in enumerate(originals):
            if attention and hasattr(layer, "self_attn"):
                layer.self_attn = _Recorded(layer.self_attn, inputs[i], keep_input=True)
            layers[i] = _Recorded(layer, outputs)
        x = mx.array(list(ids[: max(reads) + 1]), dtype=mx.int32)[None]  # (1, T)
        own = model(x)  # (1, T, V)
    finally:
        for i, layer in enumerate(originals):
            layers[i] = layer
            wrapper = getattr(layer, "self_attn", None)
            if isinstance(wrapper, _Recorded):
                layer.self_attn = wrapper.inner  # a Module again: mlx puts it back among the layer's children
    rows = mx.array(list(reads))
    hidden = mx.stack([h[0, rows] for h in outputs[:-1]], axis=1)  # (P, L-1, d)
    logits = mx.concatenate([_head(model, hidden), own[0, rows][:, None]], axis=1).astype(mx.float32)
    mx.eval(logits)
    weights = None
    if attention:
        if any(not kept for kept in inputs):
            raise NotImplementedError("this model's layers have no self_attn, so the layer view cannot show attention")
        per_layer = [_attention_weights(layer.self_attn, inputs[i][0], reads) for i, layer in enumerate(originals)]
        weights = [np.stack([w[:, j, : r + 1] for w in per_layer]) for j, r in enumerate(reads)]
    return np.array(logits), weights


def layer_capture(backend: Any, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 10,
                  attention: bool = False) -> list[LayerCapture]:
    """The layer view of each position (engine.capabilities.LayerLens) on an MLX backend."""
    ids, wanted = check_positions(token_ids, positions, int(backend.info.vocab_size))
    reads = [p - 1 for p in wanted]
    with mx.stream(backend.stream):
        logits, weights = layer_logits(backend.model, ids, reads, attention)
    return [
        summarize(logits[j], p, target_of(ids, p), top_k, None if weights is None else weights[j])
        for j, p in enumerate(wanted)
    ]
