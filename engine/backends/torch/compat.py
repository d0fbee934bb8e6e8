"""What differs between the transformers versions pyproject admits (5.0 to the newest 5.x), found by looking.

Names move inside transformers 5: `DummyLayer` and per-layer cache kwargs
appeared in later 5.x releases, `get_layer_types_and_kwargs` did not exist
in 5.0, a cache layer's `get_mask_sizes` took a `cache_position` tensor in
5.0 and a query length later, and the forward argument `past_key_values` was
renamed `cache` (the old name is announced for removal in 5.40). Every use
of such a name in the torch backend goes through here, feature-detected,
never by comparing version numbers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
from transformers import cache_utils

# transformers' placeholder layer for layers that hold no keys/values (shared-KV and MLP-only layers);
# absent before it was added, when such layers were simply left out of the cache.
DummyLayer = getattr(cache_utils, "DummyLayer", None)

# A transformers model and its config as this package reads them: their submodules and fields differ per
# architecture and per transformers version, so they are read by name, not through transformers' types.
HFModel = Any
HFConfig = Any


def holds_keys(layer: object) -> bool:
    """Whether a cache layer holds keys and values (transformers' placeholder layers hold none)."""
    return DummyLayer is None or not isinstance(layer, DummyLayer)


def layer_types_and_kwargs(text_config: HFConfig) -> tuple[list[str], list[dict]]:
    """Each decoder layer's cache type ("full_attention", "sliding_attention", ...) and its kwargs, one dict per
    layer, as transformers' `get_layer_types_and_kwargs` gives them (one shared dict in some versions; not there
    at all in 5.0, where the config's `layer_types` / `sliding_window` are read the way its DynamicCache does)."""
    finder = getattr(cache_utils, "get_layer_types_and_kwargs", None)
    if finder is not None:
        layer_types, kwargs = finder(text_config)
        layer_types = list(layer_types)
        if isinstance(kwargs, dict):
            kwargs = [dict(kwargs) for _ in layer_types]
        return layer_types, list(kwargs)
    window = getattr(text_config, "sliding_window", None) or getattr(text_config, "attention_chunk_size", None)
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is None:
        kind = "sliding_attention" if window is not None else "full_attention"
        layer_types = [kind] * int(text_config.num_hidden_layers)
    shared = getattr(text_config, "num_kv_shared_layers", None)
    if shared:
        layer_types = layer_types[:-shared]
    kwargs = [{"sliding_window": window} if t in ("sliding_attention", "chunked_attention") else {}
              for t in layer_types]
    return list(layer_types), kwargs


def query_length(query: int | torch.Tensor) -> int:
    """How many new tokens a `get_mask_sizes` call is about: an int, or (transformers 5.0) the cache positions."""
    return int(query) if isinstance(query, int) else int(query.shape[0])


@lru_cache(maxsize=None)
def _cache_argument(forward: Callable[..., Any]) -> str:
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a builtin or an odd wrapper: the old name is the one every version takes
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def cache_argument(model: HFModel) -> str:
    """The name `model.forward` takes its KV cache under: "cache" where transformers renamed it (and announced
    `past_key_values` for removal), else "past_key_values"."""
    return _cache_argument(type(model).forward)


def with_cache(model: HFModel, cache: object) -> dict[str, object]:
    """The forward keyword arguments that hand `model` its KV cache: `model(input_ids=..., **with_cache(model, c))`."""
    return {cache_argument(model): cache}
