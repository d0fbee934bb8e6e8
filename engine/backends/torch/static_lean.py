"""The lean decode step in fixed shapes, the form `torch.compile` turns into one graph (a CUDA graph on CUDA).

The lean step (lean.py) already runs a decode step at the weights floor on the CPU. Compiling
transformers' forward over the static cache instead ran at 0.62 of its speed there (docs/torch.md):
it attends over the whole preallocated buffer and keeps the forward's extra ops. This step is the
lean step's arithmetic, written once more with fixed shapes so that one compiled graph serves every
token:

- the new token's keys/values go into the `GrowingCache` buffers at a position held in a tensor
  (`GrowingCache.static_step`), so the graph does not change with the position;
- attention reads a span of the buffer, not all of it: the power of two at or above the filled
  length (at least `SPAN_FLOOR` slots), under a mask that hides the slots past the token. The
  span is the graph's one dynamic size; on CUDA each span is one recorded graph, a handful over a
  whole context, and a step attends over at most twice the positions it needs. The buffer is
  always kept a slot longer than the span (one graph serves every span);
- the matmuls use the kernel the lean step timed for each weight role (linear.py); oneDNN's goes
  into the graph as an opaque op (`COMPILABLE_KERNELS`), as inductor lowers oneDNN's linear only
  for the pre-packed weights of its freezing pass;
- query heads sharing a KV head always go in as that head's queries (lean.py's grouped form).

The layer's rotary embedding and MLP are the lean step's own (`_Layer.rotated_qk`, `feed_forward`); the
cache writes and the attention are this step's. The compiled step is built and checked against
transformers' forward by compile.py before use.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.backends.torch.cache import GrowingCache
from engine.backends.torch.compat import HFModel
from engine.backends.torch.lean import LAYER_ROLES, LeanDecodeStep, rms_norm
from engine.backends.torch.linear import COMPILABLE_KERNELS, Linear

SPAN_FLOOR = 128  # the fewest buffer slots attention reads: below this, spans would only add recorded graphs

# (ids (1,), position (1,), span, keys per layer, values per layer) -> logits (1, 1, V)
Core = Callable[[torch.Tensor, torch.Tensor, int, list[torch.Tensor], list[torch.Tensor]], torch.Tensor]


def attention_span(position: int) -> int:
    """The buffer slots the token at `position` attends over: the power of two above `position` (so at least
    position + 1 slots), at least SPAN_FLOOR."""
    return max(SPAN_FLOOR, 1 << position.bit_length())


class StaticLeanStep:
    """`step(model, ids, cache)` inside `cache.static_step()`: logits (1, 1, V) for the token in `ids`,
    written into the cache; the call form of compile.py's steps. `core` is what gets compiled."""

    def __init__(self, lean: LeanDecodeStep) -> None:
        self.lean = lean
        # The kernels as timed now, in their compilable form: a later choose_kernels does not reach the graph.
        self.linears: dict[str, Linear] = {role: COMPILABLE_KERNELS[name] for role, name in lean.kernels.items()}
        self.core: Core = self.logits

    def __call__(self, model: HFModel, ids: torch.Tensor, cache: object) -> torch.Tensor:
        assert isinstance(cache, GrowingCache), "the fixed-shape step runs over a GrowingCache"
        layers = cache.attention_layers()
        first = layers[0]
        assert first.static and first.position is not None, "call inside cache.static_step()"
        span = attention_span(first.length)
        if span >= first.capacity:
            # The buffer is kept longer than the span: a span covering a whole buffer is a contiguous view, and
            # the graph, compiled for a part of one, would be compiled again (a foreground stall of seconds).
            for layer in layers:
                layer.reserve(span + 1)
        # ids as (1,): a (1, 1) tensor's first stride is anything (a clone of a column keeps its row's), and a
        # graph compiled for one stride would be compiled again for another.
        return self.core(ids.view(-1), first.position, span, [layer.keys for layer in layers],
                         [layer.values for layer in layers])

    def logits(self, ids: torch.Tensor, position: torch.Tensor, span: int, keys: list[torch.Tensor],
               values: list[torch.Tensor]) -> torch.Tensor:
        lean = self.lean
        heads, kv_heads, hd = lean.heads, lean.kv_heads, lean.head_dim
        qkv_linear, o_linear, gate_up_linear, down_linear = (self.linears[role] for role in LAYER_ROLES)
        h = lean.embed(ids)  # (1, D)
        cos, signed_sin = lean.rope(h, position.view(1, 1))
        # Slots up to the token's own: the rest of the span holds nothing of this sequence (zeros or older tokens).
        visible = (torch.arange(span, device=position.device) <= position).view(1, 1, 1, span)
        for weights, layer_keys, layer_values in zip(lean.layers, keys, values):
            x = rms_norm(h, weights.norm_in, weights.eps_in)
            qkv = qkv_linear(x, weights.qkv, weights.qkv_bias)
            qk = weights.rotated_qk(qkv, cos, signed_sin)
            layer_keys.index_copy_(2, position, qk[:, heads:].unsqueeze(2))
            layer_values.index_copy_(2, position, qkv[:, weights.rope_rows :].view(1, kv_heads, 1, hd))
            grouped_q = qk[:, :heads].reshape(1, kv_heads, heads // kv_heads, hd)
            # narrow, not a slice: a slice must decide whether the span covers the whole buffer (and the graph
            # would be compiled again the first time it does); narrow only asserts that it fits.
            attn = F.scaled_dot_product_attention(grouped_q, layer_keys.narrow(2, 0, span),
                                                  layer_values.narrow(2, 0, span), attn_mask=visible,
                                                  scale=weights.scaling)
            h = h + o_linear(attn.reshape(1, heads * hd), weights.o, weights.o_bias)
            h = weights.feed_forward(h, gate_up_linear, down_linear)
        return self.linears["head"](rms_norm(h, lean.norm, lean.norm_eps), lean.head, lean.head_bias).view(1, 1, -1)
