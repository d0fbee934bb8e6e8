"""Offload: run a model whose weights do not all fit on the compute device.

A policy (`OffloadPolicy`, CLI form "weights=GPU%,CPU% cache=GPU%") splits
every decoder layer's weights across GPU, CPU memory and disk (`place`);
an executor (`attach`) streams the non-resident part of each layer in for
its turn while the previous layer computes, through forward hooks on
transformers' own layers. `load_offloaded` builds a model directly in that
layout; `auto_policy` / `plan_policy` choose a split that fits.

Importing this package does not import torch (the app imports the engine
API without an ML framework): the policy, placement, automatic policy and
report are plain Python; the rest is loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from engine.offload.auto import MemoryInfo, auto_policy, free_memory, kv_cache_bytes
from engine.offload.placement import Placement, Tier, cache_host_layers, place
from engine.offload.policy import OffloadPolicy, parse_offload
from engine.offload.report import OffloadReport

_LAZY = {
    "attach": "engine.offload.apply",
    "OffloadHandle": "engine.offload.executor",
    "make_kv_cache": "engine.offload.kv_cache",
    "build_empty": "engine.offload.load_in_layout",
    "load_offloaded": "engine.offload.load_in_layout",
    "plan_policy": "engine.offload.load_in_layout",
}

if TYPE_CHECKING:
    from engine.offload.apply import attach
    from engine.offload.executor import OffloadHandle
    from engine.offload.kv_cache import make_kv_cache
    from engine.offload.load_in_layout import build_empty, load_offloaded, plan_policy


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MemoryInfo",
    "OffloadHandle",
    "OffloadPolicy",
    "OffloadReport",
    "Placement",
    "Tier",
    "attach",
    "auto_policy",
    "build_empty",
    "cache_host_layers",
    "free_memory",
    "kv_cache_bytes",
    "load_offloaded",
    "make_kv_cache",
    "parse_offload",
    "place",
    "plan_policy",
]
