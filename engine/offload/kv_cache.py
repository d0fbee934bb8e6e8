"""The KV cache under an offload policy: transformers' DynamicCache, with some layers kept in CPU memory.

transformers' own offloading (`DynamicCache(offloading=True)`) moves each
layer's keys/values back to the CPU after the layer ran and prefetches the
next offloaded layer on a side stream; it offloads every full-attention
layer. We narrow it to the layers the policy puts in CPU memory
(`cache_host_layers`), so "cache=50" keeps half the layers on the GPU.
When compute runs on the CPU the cache already lives there: a plain cache.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import DynamicCache

from engine.devices import require_available
from engine.offload.placement import cache_host_layers
from engine.offload.policy import OffloadPolicy

log = logging.getLogger(__name__)


def next_host_layer(host: tuple[int, ...], start: int) -> int:
    """The first host-cache layer at or after `start`, wrapping around. `host` is sorted and non-empty."""
    return next((i for i in host if i >= start), host[0])


class PartlyOffloadedCache(DynamicCache):
    """A DynamicCache whose layers in `host_layers` live in CPU memory between uses (CUDA only)."""

    def __init__(self, config: Any, host_layers: frozenset[int]) -> None:  # config: a transformers model's
        super().__init__(config=config, offloading=True)
        self.host_layers = tuple(sorted(host_layers))

    def prefetch(self, layer_idx: int, only_non_sliding: bool = True) -> None:
        target = next_host_layer(self.host_layers, layer_idx)
        if target < len(self.layers):
            # transformers makes a generic torch.Stream on torch >= 2.7 (a context manager), else a cuda one.
            stream = self.prefetch_stream
            ctx = torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else stream
            with ctx:
                self.layers[target].prefetch()

    def offload(self, layer_idx: int, only_non_sliding: bool = True) -> None:
        if layer_idx in self.host_layers:
            self.layers[layer_idx].offload()


def make_kv_cache(config: Any, policy: OffloadPolicy, device: torch.device) -> DynamicCache:
    if device.type != "cuda" or policy.cache_gpu_percent >= 100:
        return DynamicCache(config=config)
    # transformers' offloading cache creates a stream at once, which raises on a CUDA build of torch
    # without a driver; say what is wrong instead.
    require_available(device)
    n = config.get_text_config(decoder=True).num_hidden_layers
    host = cache_host_layers(n, policy.cache_gpu_percent)
    if not host:
        return DynamicCache(config=config)
    log.debug("KV cache of layers %s in CPU memory", sorted(host))
    return PartlyOffloadedCache(config, host)
