"""A preallocated KV cache for the torch backend, with transformers 5's `Cache` interface.

transformers' `DynamicCache` appends with `torch.cat`, so every decode step
copies the whole cache: the cost of a token grows with the answer and a
3,000-token answer ends at half its starting speed. `StaticCache` fixes the
copy but attends over its whole preallocated length every step and cannot be
trimmed. This cache writes each step's keys/values in place into buffers that
grow in large steps (doubling, at least `GROW_STEP` tokens at a time), hands
attention a view of only the filled part (so a step costs what the context
costs, not what was reserved), and trims by moving a length back.

Sliding-window layers (Gemma 3's local layers) keep their last `window - 1`
tokens plus `reach` more, instead of exactly `window - 1`: trimming back by
up to `reach` tokens past the window restores them exactly, where
`DynamicCache` can only start over. Older tokens are dropped by compacting
the buffer, which happens once per many steps.

Buffers are (batch, kv_heads, capacity, head_dim), the layout attention reads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from engine.backends.torch.compat import DummyLayer, HFConfig, layer_types_and_kwargs, query_length

log = logging.getLogger(__name__)

GROW_STEP = 1024  # tokens: the smallest allocation and growth step of a layer's buffer
SLIDING_REACH = 2048  # tokens beyond the window a sliding layer keeps, so trims that far back stay exact


class CacheTrimError(ValueError):
    """The cache no longer holds what a trim to that length needs (a sliding layer dropped it)."""


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


class GrowingLayer(CacheLayerMixin):
    """Full attention: keys/values of every position so far, in a buffer grown in large steps.

    `length` is the number of positions cached; `start` the absolute position
    held in buffer slot 0 (always 0 here; sliding layers drop old positions).
    """

    is_sliding = False
    is_croppable = True
    is_compileable = False
    # Allocated by `lazy_initialization` on the first update, before anything reads them (transformers types
    # them Optional for layers that may stay empty).
    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self, *, limit: int | None = None, grow_step: int = GROW_STEP):
        super().__init__()
        self.limit = limit  # the model's context length: never allocate beyond what it can attend to
        self.grow_step = grow_step
        self.length = 0
        self.start = 0
        # Fixed-shape mode for one compiled decode step (GrowingCache.static_step): the new token is written at
        # `position` (a (1,) tensor, so the compiled graph does not specialize on it) and attention reads the
        # whole buffer under a causal mask, as transformers' StaticLayer does.
        self.static = False
        self.position: torch.Tensor | None = None

    # --- storage -----------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        self.keys = self._allocate(0, self.k_head_dim)
        self.values = self._allocate(0, self.v_head_dim)
        self.is_initialized = True

    def _allocate(self, capacity: int, head_dim: int) -> torch.Tensor:
        # zeros, not empty: the compiled step attends over the whole buffer with a mask, and a NaN left in a
        # masked slot would still poison the output (0 * NaN). The zeroing is once per allocation.
        buffer = torch.zeros(
            (self.batch_size, self.num_heads, capacity, head_dim), dtype=self.dtype, device=self.device
        )
        if buffer.device.type == "cuda":
            # A compiled step's CUDA graph writes the new token into this buffer in place: marked as living at a
            # fixed address, the graph is recorded over it rather than skipped for mutating an input. Unguarded:
            # a grown buffer re-records the graph instead of recompiling it.
            torch._dynamo.mark_static_address(buffer, guard=False)
        return buffer

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def nbytes(self) -> int:
        """Bytes the buffers hold (reserved, not only filled)."""
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def _resize(self, capacity: int, keep_from: int) -> None:
        """Move absolute positions [keep_from, length) to the front of buffers of `capacity` slots."""
        lo, hi = keep_from - self.start, self.length - self.start
        if capacity == self.capacity:  # compaction in place; copy via a clone, the ranges may overlap
            self.keys[:, :, : hi - lo] = self.keys[:, :, lo:hi].clone()
            self.values[:, :, : hi - lo] = self.values[:, :, lo:hi].clone()
        else:
            keys, values = self._allocate(capacity, self.k_head_dim), self._allocate(capacity, self.v_head_dim)
            keys[:, :, : hi - lo] = self.keys[:, :, lo:hi]
            values[:, :, : hi - lo] = self.values[:, :, lo:hi]
            self.keys, self.values = keys, values
        self.start = keep_from

    def _grown_capacity(self, needed: int) -> int:
        """Doubling, in whole steps, capped at the model's context length: O(log n) copies for n tokens."""
        capacity = _round_up(max(needed, 2 * self.capacity, self.grow_step), self.grow_step)
        if self.limit:
            capacity = min(capacity, max(self.limit, needed))
        return capacity

    def _make_room(self, new_tokens: int) -> None:
        self.reserve(self.length + new_tokens - self.start)

    def reserve(self, slots: int) -> None:
        """At least `slots` buffer slots, grown as the cache grows (so possibly more)."""
        if slots > self.capacity:
            self._resize(self._grown_capacity(slots), self.start)

    # --- the CacheLayerMixin interface ---------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H, T, D) new keys/values in place; return views of what attention reads."""
        if self.static:
            self.keys.index_copy_(2, self.position, key_states)  # type: ignore[arg-type]  # set in static mode
            self.values.index_copy_(2, self.position, value_states)  # type: ignore[arg-type]  # as the keys
            return self.keys, self.values
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        self._make_room(t)
        lo = self.length - self.start
        self.keys[:, :, lo : lo + t].copy_(key_states)
        self.values[:, :, lo : lo + t].copy_(value_states)
        first = self._first_visible(self.length) - self.start
        self.length += t
        return self.keys[:, :, first : lo + t], self.values[:, :, first : lo + t]

    def _first_visible(self, length: int) -> int:
        """The first absolute position the next tokens attend to."""
        return 0

    def get_mask_sizes(self, query: int | torch.Tensor) -> tuple[int, int]:
        """(kv length, kv offset) for `query` new tokens (an int; transformers 5.0 passes their positions)."""
        if self.static:
            return self.keys.shape[-2], 0
        kv_offset = self._first_visible(self.length)
        return self.length - kv_offset + query_length(query), kv_offset

    def get_seq_length(self) -> int:
        # Static mode: the (1,) position tensor, so a compiled graph does not specialise on the length.
        return self.position if self.static else self.length  # type: ignore[return-value]  # a tensor, as said

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # the name transformers 5.0 asks for
        return -1

    def can_crop_to(self, length: int) -> bool:
        return 0 <= length <= self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last `-tokens_to_remove` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count: how many tokens to remove from the end")
        target = self.length + tokens_to_remove
        if not self.can_crop_to(target):
            raise CacheTrimError(f"this layer cannot go back to {target} tokens (it holds {self.start}..{self.length})")
        self.length = target

    def reset(self) -> None:
        self.length = 0
        self.start = 0

    def offload(self) -> None:  # the offloading caches are engine.offload's; this one stays where it was made
        pass

    def prefetch(self) -> None:
        pass

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self.keys = self.keys.index_select(0, beam_idx.to(self.device))
            self.values = self.values.index_select(0, beam_idx.to(self.device))


class GrowingSlidingLayer(GrowingLayer):
    """Sliding-window (or chunked) attention: attends to the last `window - 1` positions plus the new ones.

    Keeps `reach` positions more than attention needs, so a trim up to `reach`
    tokens back stays exact. When the buffer fills, positions older than
    that are dropped by moving the rest to the front (compaction), or the
    buffer doubles if compaction would free less than half of it.
    """

    is_sliding = True

    def __init__(self, sliding_window: int, *, reach: int = SLIDING_REACH, limit: int | None = None,
                 grow_step: int = GROW_STEP) -> None:
        super().__init__(limit=limit, grow_step=grow_step)
        self.sliding_window = sliding_window
        self.reach = reach

    def _first_visible(self, length: int) -> int:
        return max(length - self.sliding_window + 1, 0)

    def _make_room(self, new_tokens: int) -> None:
        needed = self.length + new_tokens - self.start
        if needed <= self.capacity:
            return
        keep_from = max(self.start, self._first_visible(self.length) - self.reach)
        kept = self.length - keep_from + new_tokens
        if keep_from > self.start and kept <= self.capacity // 2:
            self._resize(self.capacity, keep_from)
        else:
            self._resize(self._grown_capacity(kept), keep_from)

    def can_crop_to(self, length: int) -> bool:
        # The next token at `length` attends from _first_visible(length): still held, or the layer holds everything.
        return 0 <= length <= self.length and (self.start == 0 or self._first_visible(length) >= self.start)


LAYERS_BY_TYPE = {
    "full_attention": GrowingLayer,
    "sliding_attention": GrowingSlidingLayer,
    "chunked_attention": GrowingSlidingLayer,
}


class UnsupportedCacheLayout(ValueError):
    """The model has layers (linear attention, compressed attention, ...) this cache does not hold."""


class GrowingCache(Cache):
    """One `GrowingLayer`/`GrowingSlidingLayer` per decoder layer, as the model's config lays them out.

    Raises UnsupportedCacheLayout for layer types it does not know; the
    backend then uses transformers' `DynamicCache` instead.
    """

    def __init__(self, config: HFConfig, *, reach: int | None = None, grow_step: int | None = None) -> None:
        reach = SLIDING_REACH if reach is None else reach
        grow_step = grow_step or GROW_STEP
        text_config = config.get_text_config(decoder=True)
        limit = int(getattr(text_config, "max_position_embeddings", 0) or 0) or None
        layer_types, per_layer_kwargs = layer_types_and_kwargs(text_config)
        layers: list = []
        for layer_type, kwargs in zip(layer_types, per_layer_kwargs):
            if layer_type == "dummy" and DummyLayer is not None:
                layers.append(DummyLayer())
            elif layer_type == "full_attention":
                layers.append(GrowingLayer(limit=limit, grow_step=grow_step))
            elif layer_type in LAYERS_BY_TYPE:
                layers.append(
                    GrowingSlidingLayer(kwargs["sliding_window"], reach=reach, limit=limit, grow_step=grow_step)
                )
            else:
                raise UnsupportedCacheLayout(f"no preallocated cache for {layer_type!r} layers")
        super().__init__(layers=layers)
        self._attention = [layer for layer in layers if isinstance(layer, GrowingLayer)]

    def attention_layers(self) -> list[GrowingLayer]:
        """The layers holding keys/values (all but transformers' placeholder layers), in model order."""
        return self._attention

    def can_crop_to(self, length: int) -> bool:
        """Whether every layer still holds what the token after `length` needs."""
        return all(layer.can_crop_to(length) for layer in self.attention_layers())

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last `-tokens_to_remove` tokens from every layer, or raise CacheTrimError and change nothing."""
        target = self.get_seq_length() + tokens_to_remove
        if tokens_to_remove > 0 or not self.can_crop_to(target):
            raise CacheTrimError(f"the cache cannot go back to {target} tokens")
        super().crop(tokens_to_remove)

    def nbytes(self) -> int:
        """Bytes reserved by every layer's buffers."""
        return sum(layer.nbytes() for layer in self.attention_layers())

    @property
    def supports_static_step(self) -> bool:
        """Whether `static_step` applies: every attention layer full (no sliding window) and already filled once."""
        layers = self.attention_layers()
        return bool(layers) and all(not layer.is_sliding and layer.is_initialized for layer in layers)

    @contextmanager
    def static_step(self) -> Iterator[None]:
        """Run one decode token with fixed-shape tensors, the form a compiled step needs.

        Inside, each layer writes the token at a tensor position and hands
        attention its whole buffer; the mask hides slots past the token. On a
        clean exit the cache is one token longer.
        """
        layers = self.attention_layers()
        for layer in layers:
            layer._make_room(1)
        position = getattr(self, "_position", None)
        if position is None or position.device != layers[0].device:
            position = self._position = torch.zeros(1, dtype=torch.long, device=layers[0].device)
        position.fill_(layers[0].length)
        for layer in layers:
            layer.static, layer.position, layer.is_compileable = True, position, True
        try:
            yield
        finally:
            for layer in layers:
                layer.static, layer.is_compileable = False, False
        for layer in layers:
            layer.length += 1
