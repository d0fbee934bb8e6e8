"""The layer view (logit lens) and attention on torch: transformers' `output_hidden_states`, eager attention weights.

One forward over the tokens up to the last position read, without a KV cache
(the backend's own cache is untouched), asks transformers for every layer's
hidden state. In transformers 5 `hidden_states` holds L + 1 entries: the
embeddings, the outputs of layers 0..L-2, and the last layer's output
already through the final norm. So layer i < L-1 is `lm_head(norm(hs[i + 1]))`
and the last layer is the model's own logits. Attention weights exist only
in the eager implementation: the model is switched to it for this pass only
(the decode path keeps SDPA) and switched back before returning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from engine.lens import LayerCapture, check_positions, summarize, target_of

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _eager_attention(model: Any, wanted: bool) -> Iterator[None]:
    """The model with eager attention (the only one that returns weights) for the block, when `wanted`."""
    before = getattr(model.config, "_attn_implementation", None)
    if not wanted or before in (None, "eager"):
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def final_norm(model: Any) -> Any:
    """The decoder's final norm module (`model.model.norm` for Llama-shaped models)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    for name in ("norm", "final_layernorm", "ln_f"):
        norm = getattr(decoder, name, None)
        if norm is not None:
            return norm
    raise NotImplementedError(f"{type(model).__name__}: no final norm found, so its layer view is not available")


def head_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The model's head over already-normed hidden rows, with its final logit soft-cap when it has one."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    return logits


@torch.inference_mode()
def layer_logits(model: Any, ids: Sequence[int], reads: Sequence[int], attention: bool
                 ) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """((P, L, V) float32 logit-lens logits at rows `reads`, per read row (L, H, row + 1) attention or None)."""
    device = next(model.parameters()).device
    end = max(reads) + 1
    input_ids = torch.tensor([list(ids[:end])], dtype=torch.long, device=device)  # (1, T)
    with _eager_attention(model, attention):
        out = model(input_ids=input_ids, use_cache=False, output_hidden_states=True, output_attentions=attention)
    rows = torch.tensor(list(reads), device=device)
    hs = out.hidden_states  # L + 1 of (1, T, d); the last one already normed
    norm = final_norm(model)
    inner = torch.stack([h[0, rows] for h in hs[1:-1]], dim=1)  # (P, L-1, d)
    lens = head_logits(model, norm(inner))  # (P, L-1, V)
    last = out.logits[0, rows][:, None]  # (P, 1, V): the model's own
    logits = torch.cat([lens, last], dim=1).float().cpu().numpy()
    weights = None
    if attention:
        if not out.attentions or out.attentions[0] is None:
            raise NotImplementedError(f"{type(model).__name__} returns no attention weights")
        per_layer = torch.stack([a[0] for a in out.attentions])  # (L, H, T, T)
        weights = [per_layer[:, :, r, : r + 1].float().cpu().numpy() for r in reads]
    return logits, weights


def layer_capture(backend: Any, token_ids: Sequence[int], positions: Sequence[int], *, top_k: int = 10,
                  attention: bool = False) -> list[LayerCapture]:
    """The layer view of each position (engine.capabilities.LayerLens) on a torch backend."""
    vocab = int(backend.model.config.get_text_config().vocab_size)
    ids, wanted = check_positions(token_ids, positions, vocab)
    reads = [p - 1 for p in wanted]
    logits, weights = layer_logits(backend.model, ids, reads, attention)
    return [
        summarize(logits[j], p, target_of(ids, p), top_k, None if weights is None else weights[j])
        for j, p in enumerate(wanted)
    ]
